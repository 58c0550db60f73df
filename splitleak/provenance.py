"""Which plug-in a fault is in, in words: its kind and name, and for an installed one its entry
point and package (as the registry names a plug-in it refuses), and where its code raised."""

from __future__ import annotations

import traceback
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any


def plugin_origin(kind: str, name: str, entry: Any) -> str:
    """`dataset 'blobs' (splitleak.datasets entry point 'mydata:Blobs' of package 'mydata')`
    for an installed plug-in, `dataset 'wine'` for a built-in one. Called on error paths only
    (it reads the installed packages' entry points again)."""
    group = f"splitleak.{kind}s"
    for ep in entry_points(group=group):
        if ep.name == name:
            package = f" of package {ep.dist.name!r}" if ep.dist is not None else ""
            return f"{kind} {name!r} ({group} entry point {ep.value!r}{package})"
    module = getattr(entry, "__module__", "")
    if module and module.split(".")[0] not in BUILT_IN_PACKAGES:
        return f"{kind} {name!r} ({module}.{getattr(entry, '__qualname__', entry)!s})"
    return f"{kind} {name!r}"


# The packages of this project: a plug-in defined elsewhere is a package of one's own.
BUILT_IN_PACKAGES = frozenset({"splitleak", "label_party", "passive_party", "attacker",
                               "orchestration"})


def is_built_in(entry: Any) -> bool:
    return str(getattr(entry, "__module__", "")).split(".")[0] in BUILT_IN_PACKAGES


def raised(err: BaseException, entry: Any) -> str:
    """`RuntimeError: boom (at mydata/__init__.py:42)`: the exception and the line of the
    plug-in's own code it came from (its innermost frame in the plug-in's package; else the
    innermost frame)."""
    frames = traceback.extract_tb(err.__traceback__)
    top = str(getattr(entry, "__module__", "")).split(".")[0]
    own = [f for f in frames if top and (f"/{top}/" in f.filename or Path(f.filename).stem == top)]
    found = own or frames
    where = f" (at {_short(found[-1].filename)}:{found[-1].lineno})" if found else ""
    return f"{type(err).__name__}: {err}{where}"


def _short(filename: str) -> str:
    parts = Path(filename).parts
    return str(Path(*parts[-2:])) if len(parts) >= 2 else filename
