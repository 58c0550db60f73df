"""What every typed artifact shares: fields beyond the declared ones kept in the order written,
read by their name in the file, and written back as the same indented JSON, atomically."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from splitleak.config import error_sentence
from splitleak.fileio import write_atomically


class Artifact(BaseModel):
    """A file's declared fields (typed), and the others it holds riding along as written."""

    model_config = ConfigDict(extra="allow")

    def get(self, key: str, default: Any = None) -> Any:
        """A field by its name in the file (declared or not); `default` when the file lacks it."""
        return self.as_dict().get(key, default)

    def as_dict(self) -> dict[str, Any]:
        """The file's content as a dict (the fields it had, in its order)."""
        return self.model_dump(exclude_unset=True)


def finite_or_null(value: Any) -> Any:
    """`value` with every NaN and infinity in it as None (JSON's null: strict JSON has no NaN,
    which `json.dumps` would otherwise write and other languages' parsers refuse)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(item) for item in value]
    return value


def write_model(path: Path, model: BaseModel, default: Any = None) -> None:
    """The fields that were set, in the order written (the bytes of the dict the model holds),
    as strict JSON: a figure that is not a number is null."""
    text = json.dumps(finite_or_null(model.model_dump(exclude_unset=True)), indent=2,
                      default=default, allow_nan=False)
    write_atomically(path, lambda tmp: tmp.write_text(text))


Model = TypeVar("Model", bound=BaseModel)
SHOWN = 60  # characters of a bad value quoted in a message


def first_error(err: ValidationError) -> str:
    """Pydantic's first error in a few words: the field, what is wrong, the value found."""
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    got = first.get("input")
    quoted = "" if isinstance(got, dict | list) or first["type"] in ("missing", "json_invalid") \
        else f" (got {repr(got)[:SHOWN]})"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{f'field {where}: ' if where else ''}{error_sentence(first)}{quoted}{more}"


def read_model(path: Path, model: type[Model], error: type[Exception], what: str) -> Model:
    """`model` from the JSON file at `path`; `error` naming the file, the first bad field and
    what is wrong when it cannot be read or is not `what`."""
    try:
        return model.model_validate_json(path.read_bytes())
    except OSError as err:
        raise error(f"cannot read {path}: {err.strerror or err}") from None
    except ValidationError as err:
        raise error(f"{path} is not a readable {what}: {first_error(err)}") from None


def read_versioned(path: Path, model: type[Model], version: int, error: type[Exception],
                   what: str) -> Model:
    """`model` from the JSON file at `path`, whose "format" must be `version`; `error` naming
    the file (`what` it should be) when it is not. OSError as raised."""
    try:
        data = json.loads(path.read_bytes())
    except ValueError as err:
        raise error(f"{path} is not a readable {what}: {err}") from None
    found = data.get("format") if isinstance(data, dict) else None
    if found != version:
        raise error(f"{path}: a {what} of format {found}; this version reads format {version}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise error(f"{path} is not a readable {what}: {first_error(err)}") from None
