"""Which plug-in a fault is in, in words: its kind and name, and for an installed one its entry
point and package (as the registry names a plug-in it refuses), and where its code raised."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from splitleak.config import ConfigError
from splitleak.registry import describe_entry_point, installed_entry_points


class PluginError(RuntimeError):
    """A plug-in that raised, or answered outside its interface (an objective's gradients, a
    defense's gradient, an attack's result). The message names the plug-in, and its entry point
    and package where installed: the run stops with it and exits 2, as for a bad config."""


def plugin_origin(kind: str, name: str, entry: Any) -> str:
    """`dataset 'blobs' (splitleak.datasets entry point 'mydata:Blobs' of package 'mydata')`
    for an installed plug-in, `dataset 'wine'` for a built-in one."""
    for ep in installed_entry_points().get(f"splitleak.{kind}s", ()):
        if ep.name == name:
            return describe_entry_point(kind, ep)
    module = getattr(entry, "__module__", "")
    if module and module.split(".")[0] not in BUILT_IN_PACKAGES:
        return f"{kind} {name!r} ({module}.{getattr(entry, '__qualname__', entry)!s})"
    return f"{kind} {name!r}"


def own_plugin(kind: str, name: str, entry: Any) -> str | None:
    """plugin_origin of a plug-in of one's own (installed, or defined outside this project);
    None for a built-in one."""
    module = getattr(entry, "__module__", "")
    return None if module.split(".")[0] in BUILT_IN_PACKAGES else plugin_origin(kind, name, entry)


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


@contextmanager
def blamed(kind: str, name: str, entry: Any, method: str,
           error: type[Exception] = PluginError) -> Iterator[None]:
    """An exception out of an installed plug-in's `method` as `error` naming it and the line it
    raised at (a built-in's, a PluginError and a ConfigError pass unchanged)."""
    try:
        yield
    except (PluginError, ConfigError):
        raise
    except Exception as err:
        if is_built_in(entry):
            raise
        raise error(f"{plugin_origin(kind, name, entry)}: {method}() raised "
                    f"{raised(err, entry)}") from err


def described(value: Any) -> str:
    """What a plug-in returned, in words: `an array of dtype float32 and shape [3, 2]`, `a list`."""
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {list(value.shape)}"
    return f"a {type(value).__name__}"


def _short(filename: str) -> str:
    parts = Path(filename).parts
    return str(Path(*parts[-2:])) if len(parts) >= 2 else filename
