"""A package of one's own, "installed" for a test: its module and a hand-written
`<name>-<version>.dist-info` (METADATA, entry_points.txt) in a directory to put on PYTHONPATH,
which importlib.metadata finds as pip's install would leave it."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def install(site: Path, package: str, source: str, entry_points: dict[str, dict[str, str]],
            version: str = "0.1") -> dict[str, str]:
    """Write module `package` (its `__init__.py` holds `source`) declaring `entry_points`
    ({group: {name: "module:Class"}}) into `site`; an environment with the repository and
    `site` on PYTHONPATH."""
    (site / package).mkdir(parents=True, exist_ok=True)
    (site / package / "__init__.py").write_text(source)
    info = site / f"{package}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in entries.items()) + "\n"
        for group, entries in entry_points.items()))
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
