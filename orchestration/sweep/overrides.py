"""Config paths of a sweep (`defense.0.s`, `run.seed`) and how an override changes a config dict."""

from __future__ import annotations

import copy
from typing import Any


class OverrideError(ValueError):
    """An override that does not fit the config it is applied to; the message names the path."""


def _index(container: list[Any], key: str, prefix: str) -> int:
    if not key.isdigit():
        raise OverrideError(f"{prefix or '(top level)'} is a list: index it by number, not {key!r}")
    index = int(key)
    if index >= len(container):
        raise OverrideError(f"{prefix} has {len(container)} entr{'y' if len(container) == 1 else 'ies'}, "
                            f"so there is no {prefix}.{index}")
    return index


def merge(current: Any, value: Any) -> Any:
    """What a path holds after the override: a table merges into a table key by key, unless
    both name a plug-in and the names differ (a different plug-in replaces the old one with
    all its parameters); anything else replaces the old value."""
    if not (isinstance(current, dict) and isinstance(value, dict)):
        return copy.deepcopy(value)
    if "name" in current and "name" in value and current["name"] != value["name"]:
        return copy.deepcopy(value)
    merged = dict(current)
    for key, item in value.items():
        merged[key] = merge(current.get(key), item)
    return merged


def apply(data: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `data` with `value` merged in at the dotted `path` (list items by index:
    `defense.0.s`). A missing table on the way is created; a missing list item is an error."""
    keys = path.split(".")
    if not all(keys):
        raise OverrideError(f"{path!r} is not a config path (empty part between dots)")
    result = copy.deepcopy(data)
    container: Any = result
    prefix = ""
    for key in keys[:-1]:
        if isinstance(container, list):
            index = _index(container, key, prefix)
            if container[index] is None:
                container[index] = {}
            container = container[index]
        elif isinstance(container, dict):
            if container.get(key) is None:
                container[key] = {}
            container = container[key]
        else:
            raise OverrideError(f"{prefix} is {container!r}, not a table or list, so it has no {key!r}")
        prefix = f"{prefix}.{key}" if prefix else key
    last = keys[-1]
    if isinstance(container, list):
        index = _index(container, last, prefix)
        container[index] = merge(container[index], value)
    elif isinstance(container, dict):
        container[last] = merge(container.get(last), value)
    else:
        raise OverrideError(f"{prefix} is {container!r}, not a table or list, so it has no {last!r}")
    return result

