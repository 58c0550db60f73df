"""The base of every settings table a user writes (config, threat model, plug-in parameters,
sweep file): unknown keys refused, values taken as written, finite numbers only.

Pydantic's lax mode would read `tls = "false"` as False, `torch_threads = "4"` as 4 and
`batch_size = true` as 1, and accepts inf and nan for a float: each a mistake that trains
something other than what the user meant (an infinite learning rate diverges at the first
step). TOML has booleans, integers and floats of its own, so a field that holds only those
(and perhaps a few named words, such as "auto") refuses other text, a boolean refuses a number
and a number a boolean; every float must be finite.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator

_PLAIN = (bool, int, float, type(None))


def _plain(annotation: Any) -> tuple[set[type], set[Any]] | None:
    """The plain types (bool, int, float, None) and literal words a field holds; None when it
    holds anything else (text, lists, tables)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _plain(get_args(annotation)[0])
    if origin is Literal:
        return set(), set(get_args(annotation))
    if origin is Union or origin is types.UnionType:
        kinds: set[type] = set()
        words: set[Any] = set()
        for member in get_args(annotation):
            found = _plain(member)
            if found is None:
                return None
            kinds |= found[0]
            words |= found[1]
        return kinds, words
    return ({annotation}, set()) if annotation in _PLAIN else None


def _wrong(value: Any, kinds: set[type], words: set[Any]) -> str | None:
    """Why `value` is not one of `kinds` as written (None when it is, or for pydantic to say)."""
    flag = kinds - {type(None)} == {bool}
    numbers = bool(kinds & {int, float})
    choices = "".join(f" or {w!r}" for w in sorted(words, key=str))
    if isinstance(value, str) and value not in words and (flag or numbers):
        return (f"{value!r} is text; give " + ("true or false" if flag else "a number") + choices
                + (" (TOML: true, not \"true\")" if flag else " (TOML: 4 or 0.5, not \"4\")"))
    if isinstance(value, bool) and numbers and bool not in kinds:
        return f"{value} is a boolean; give a number{choices}"
    if isinstance(value, int | float) and not isinstance(value, bool) and flag:
        return f"{value} is a number; give true or false{choices}"
    if isinstance(value, float) and int in kinds and float not in kinds:
        return f"{value} is not a whole number; give an integer{choices} (TOML: 8, not 8.0)"
    return None


def _whole(value: Any) -> Any:
    """An integer as written: TOML's `8`, never `true` (which pydantic would read as 1) or `8.0`."""
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is a boolean; give an integer")
    if isinstance(value, float):
        raise ValueError(f"{value} is not a whole number; give an integer (TOML: 8, not 8.0)")
    return value


def _number(value: Any) -> Any:
    """A number as written: `true` is refused, not read as 1.0."""
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is a boolean; give a number")
    return value


# The items of a list or table of numbers: the field-level check of `Settings` sees only a
# field's own value, so a list's items say for themselves what they take (`layers = [true, 8]`
# would otherwise train a width-1 layer, `[[0.0, 15]]` read 0.0 as 0).
StrictInt = Annotated[int, BeforeValidator(_whole)]
StrictPositiveInt = Annotated[int, BeforeValidator(_whole), Field(gt=0)]
StrictNonNegativeInt = Annotated[int, BeforeValidator(_whole), Field(ge=0)]
StrictFloat = Annotated[float, BeforeValidator(_number)]
StrictPositiveFloat = Annotated[float, BeforeValidator(_number), Field(gt=0)]


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _as_written(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        plain = _plain(field.annotation) if field is not None else None
        if plain is not None and value is not None:
            why = _wrong(value, *plain)
            if why is not None:
                raise ValueError(why)
        return value


# Upper bounds of counts a user sets (a plug-in's iterations, widths, batch sizes): far above
# any published set-up, low enough that a typo (an extra zero or three) is refused rather than
# running for days or asking for more memory than a machine has.
MAX_ITERATIONS = 1_000_000  # optimizer steps, solver sweeps
MAX_EPOCHS = 10_000  # passes over data
MAX_RESTARTS = 1_000  # k-means restarts, rounds
MAX_WIDTH = 65_536  # hidden layers, latent sizes, bins
MAX_BATCH = 1 << 20  # rows per batch
MAX_ROWS = 100_000_000  # rows drawn or known
MAX_STEPS = 1_000_000_000  # train steps of a run (and between its evaluations, checkpoints)
# A defense's noise scale or budget factor, an objective's weight of a term in its loss, and
# the smallest privacy ε: beyond them the noise or the loss overflows float32 (α = 1e300 made
# dcor's loss inf at step 0) or drowns the gradient by more than any study needs.
MAX_SCALE = 1e6
# A learning rate or weight decay: torch's optimizers take it as a float32 scalar, so one over
# 3.4e38 stopped every process at its first update with "value cannot be converted to type
# float without overflow". Up to this bound a rate that is too large fails as a divergence,
# named (lr = 1e30 is how the tests make a model diverge).
MAX_RATE = 1e30
MIN_EPSILON = 1e-6
