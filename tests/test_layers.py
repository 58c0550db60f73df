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
