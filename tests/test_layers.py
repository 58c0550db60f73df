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
    module.write_text("def f():\n    from attacker.sidecar.store import GradientStore\n    import label_party\n")
    assert imported_packages(module) == {(2, "attacker"), (3, "label_party")}


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
