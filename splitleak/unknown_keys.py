"""An unknown key in a settings table: the nearest allowed key, and the keys the table allows."""

from __future__ import annotations

import difflib
import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

SHOWN_KEYS = 20  # a table allowing more is shown as its nearest keys only


def _models_in(annotation: Any) -> list[Any]:
    """The annotations a value of `annotation` may hold, Optional / unions / Annotated undone."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _models_in(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [found for member in get_args(annotation) for found in _models_in(member)]
    return [annotation]


def _step(annotation: Any, part: str | int) -> Any:
    """The annotation of `part` (a field name, a list index or a table key) inside a value of
    `annotation`; None where it cannot be told."""
    for member in _models_in(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            for name, field in member.model_fields.items():
                if part in (name, field.alias):
                    return field.annotation
        elif get_origin(member) in (list, tuple) and isinstance(part, int) and get_args(member):
            return get_args(member)[0]
        elif get_origin(member) is dict and isinstance(part, str) and len(get_args(member)) == 2:
            return get_args(member)[1]
    return None


def allowed_keys(model: type[BaseModel], table: tuple[str | int, ...]) -> list[str] | None:
    """The keys the table at `table` (a pydantic loc) allows, as a user writes them (the alias
    where a field has one); None where the table's model cannot be told."""
    annotation: Any = model
    for part in table:
        annotation = _step(annotation, part)
        if annotation is None:
            return None
    for member in _models_in(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return [field.alias or name for name, field in member.model_fields.items()]
    return None


def unknown_key_hint(model: type[BaseModel] | None, loc: tuple[str | int, ...]) -> str:
    """" (did you mean 'batch_size'? allowed keys: ...)" for the unknown key at the end of `loc`
    ("" where the table's keys cannot be told)."""
    if model is None or not loc or not isinstance(loc[-1], str):
        return ""
    keys = allowed_keys(model, loc[:-1])
    if keys is None:
        return ""
    if not keys:
        return " (no parameter is allowed here)"
    near = difflib.get_close_matches(loc[-1], keys, n=1, cutoff=0.6)
    said = [f"did you mean {near[0]!r}?"] if near else []
    if len(keys) <= SHOWN_KEYS:
        said.append(f"allowed keys: {', '.join(keys)}")
    return f" ({' '.join(said)})" if said else ""
