"""The layers you can see (DESIGN.md §4): core <- roles <- orchestration, no role imports another.

Every import statement counts, including the ones inside functions (lazy imports), since a
lazy import across a layer is still an arrow pointing the wrong way.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = "splitleak"
ROLES = ("label_party", "passive_party", "attacker")
ORCHESTRATION = "orchestration"
PROJECT = (CORE, *ROLES, ORCHESTRATION)

# What each layer may import from the project, besides itself.
ALLOWED: dict[str, set[str]] = {
    CORE: set(),
    **{role: {CORE} for role in ROLES},
    ORCHESTRATION: {CORE, *ROLES},
}


def imported_packages(path: Path) -> set[tuple[int, str]]:
    """(line, top-level project package) of every import in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.update((node.lineno, n.split(".")[0]) for n in names if n.split(".")[0] in PROJECT)
    return found


def modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "v1" not in p.parts)


@pytest.mark.parametrize("package", PROJECT)
def test_imports_point_down(package: str) -> None:
    wrong = []
    for path in modules(package):
        for line, target in imported_packages(path):
            if target != package and target not in ALLOWED[package]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package]) or 'itself'}:\n" + \
        "\n".join(sorted(wrong))


def test_every_layer_has_modules() -> None:
    assert all(modules(p) for p in PROJECT)


def test_the_check_sees_lazy_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from attacker.sidecar.store import GradientStore\n"
                      "    import label_party\n")
    assert imported_packages(module) == {(2, "attacker"), (3, "label_party")}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str:
    """A module's room: the folder it sits in below its package (package.folder), or the module
    itself when it sits at the package's top (cli.py, run.py, …: each is its own room)."""
    parts = module.split(".")
    if len(parts) >= 3 and (ROOT / parts[0] / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module


def room_graph(package: str) -> dict[str, set[str]]:
    """Room -> the rooms of the same package it imports (lazy imports included)."""
    graph: dict[str, set[str]] = {}
    for path in modules(package):
        source = _room(_module_name(path))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] == package and _exists(name):
                    target = _room(name)
                    if target != source and target != package:
                        graph.setdefault(source, set()).add(target)
    return graph


def _exists(module: str) -> bool:
    base = ROOT / module.replace(".", "/")
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (as a path), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


@pytest.mark.parametrize("package", PROJECT)
def test_no_loop_between_the_rooms_of_a_package(package: str) -> None:
    """Folders by concern (issue 24): the sidecar, the analysis, the attacks (each run-level
    family with its engine and report section), the report, the benchmarks; sweep and compare;
    no two import each other, directly or around a loop."""
    assert _cycle(room_graph(package)) is None, " -> ".join(_cycle(room_graph(package)) or [])


def test_the_loop_check_finds_a_loop() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_relative_imports() -> None:
    """Every import names its module from the top (a relative import hides which layer and
    room it reaches into)."""
    relative = [f"{path.relative_to(ROOT)}:{node.lineno}" for package in PROJECT
                for path in modules(package)
                for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
                if isinstance(node, ast.ImportFrom) and node.level > 0]
    assert not relative, relative


def test_attacker_is_in_rooms_by_concern() -> None:
    rooms = {p.name for p in (ROOT / "attacker").iterdir() if (p / "__init__.py").exists()}
    assert rooms == {"sidecar", "analysis", "attacks", "report", "bench"}
    flat = {p.name for p in (ROOT / "attacker").glob("*.py")}
    assert flat == {"__init__.py", "__main__.py", "cli.py"}
    families = {p.name for p in (ROOT / "attacker" / "attacks").iterdir() if p.is_dir()
                and (p / "__init__.py").exists()}
    assert families == {"completion", "reconstruction", "exact", "integrity"}


def _top_level_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_ray_is_imported_only_by_its_engine() -> None:
    """Ray is an optional extra (splitleak[ray]): one module imports it, and that module is
    imported only when the ray engine is asked for."""
    engine = ROOT / "orchestration" / "sweep" / "ray_engine.py"
    importing = []
    for package in PROJECT:
        for path in modules(package):
            tree = ast.parse(path.read_text(), filename=str(path))
            names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                     for alias in node.names}
            names |= {node.module for node in ast.walk(tree)
                      if isinstance(node, ast.ImportFrom) and node.module}
            if path != engine and any(n == "ray" or n.startswith("ray.") for n in names):
                importing.append(str(path.relative_to(ROOT)))
            if "orchestration.sweep.ray_engine" in _top_level_imports(path):
                importing.append(f"{path.relative_to(ROOT)} (eagerly imports the ray engine)")
    assert not importing, importing


# Files that read JSON of the run directory in a format of their own, not a run artifact's.
OWN_JSON_FORMATS = {
}
ARTIFACTS = ROOT / "splitleak" / "artifacts"


def artifact_file_names() -> set[str]:
    """The name of every file of a run, sweep and comparison directory (splitleak.artifacts)."""
    from splitleak.artifacts.paths import CHECKPOINT_MANIFEST, CompareDir, RunDir, SweepDir

    found = {CHECKPOINT_MANIFEST}
    for layout in (RunDir(Path("r")), SweepDir(Path("s")), CompareDir(Path("c"))):
        for name, member in vars(type(layout)).items():
            if isinstance(member, property):
                found.add(getattr(layout, name).name)
            elif callable(member) and not name.startswith("_"):
                try:
                    found.add(member(layout, 1).name)  # a party's file
                except (TypeError, AttributeError):
                    pass  # not a path (a point of a sweep: a RunDir)
    return {name for name in found if "." in name}


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}


def outside_artifacts() -> list[Path]:
    return [path for package in PROJECT for path in modules(package)
            if not path.is_relative_to(ARTIFACTS)]


def test_no_artifact_file_name_outside_the_artifacts_package() -> None:
    """A run artifact's path is built in one place: no other module spells its file name as a
    path (a sentence that names the file for a reader is fine)."""
    names = artifact_file_names()
    assert {"summary.json", "outcome.json", "timing.json", "leak.parquet", "metrics.jsonl",
            "sweep.parquet", "table.csv"} <= names
    spelled = []
    for path in outside_artifacts():
        tree = ast.parse(path.read_text(), filename=str(path))
        docstrings = _docstrings(tree)
        spelled += [f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
                    if isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings and " " not in node.value
                    and node.value.rsplit("/", 1)[-1] in names]
    assert not spelled, "use splitleak.artifacts.paths:\n" + "\n".join(spelled)


def _reads_a_file(node: ast.Call) -> bool:
    """json.load(f), or json.loads(path.read_text() / read_bytes())."""
    func = node.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
            and func.value.id == "json" and func.attr in ("load", "loads")):
        return False
    if func.attr == "load":
        return True
    argument = node.args[0] if node.args else None
    return (isinstance(argument, ast.Call) and isinstance(argument.func, ast.Attribute)
            and argument.func.attr in ("read_text", "read_bytes"))


def test_no_json_file_read_outside_the_artifacts_package() -> None:
    """Run artifacts are read through their typed models (splitleak.artifacts), never parsed
    by hand; OWN_JSON_FORMATS lists the files of a format of their own."""
    parsed = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in outside_artifacts()
              if str(path.relative_to(ROOT)) not in OWN_JSON_FORMATS
              for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
              if isinstance(node, ast.Call) and _reads_a_file(node)]
    assert not parsed, "read it through splitleak.artifacts:\n" + "\n".join(parsed)


def test_the_artifact_checks_see_a_spelled_name_and_a_parsed_file(tmp_path: Path) -> None:
    tree = ast.parse('import json\njson.loads(path.read_text())\nx = run.root / "outcome.json"\n')
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and _reads_a_file(n)]
    assert len(calls) == 1
    assert [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and n.value in artifact_file_names()] == ["outcome.json"]
