"""Tensors to and from splitleak.v1.Tensor: raw little-endian C-order bytes, checked on decode."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import NamedTuple, cast

import numpy as np
import torch

from splitleak.v1 import tensor_pb2

# A wire dtype: a splitleak.v1.DType value (tensor_pb2.FLOAT32, ...) or the torch dtype it carries.
DType = int | torch.dtype


class CodecError(ValueError):
    """A Tensor message is malformed or not what the receiver expects; names the field."""


class _Spec(NamedTuple):
    name: str
    torch_dtype: torch.dtype
    wire: np.dtype  # layout of the bytes; bfloat16 travels as its int16 bit pattern


_SPECS: dict[tensor_pb2.DType.ValueType, _Spec] = {
    tensor_pb2.FLOAT32: _Spec("float32", torch.float32, np.dtype("<f4")),
    tensor_pb2.FLOAT16: _Spec("float16", torch.float16, np.dtype("<f2")),
    tensor_pb2.BFLOAT16: _Spec("bfloat16", torch.bfloat16, np.dtype("<i2")),
    tensor_pb2.FLOAT64: _Spec("float64", torch.float64, np.dtype("<f8")),
    tensor_pb2.INT64: _Spec("int64", torch.int64, np.dtype("<i8")),
    tensor_pb2.INT32: _Spec("int32", torch.int32, np.dtype("<i4")),
    tensor_pb2.UINT8: _Spec("uint8", torch.uint8, np.dtype("u1")),
    tensor_pb2.BOOL: _Spec("bool", torch.bool, np.dtype("?")),
}
_FROM_TORCH = {spec.torch_dtype: code for code, spec in _SPECS.items()}
# Keyed by kind and size ("f4", "b1"), so either byte order maps to the same wire dtype.
_FROM_NUMPY = {spec.wire.str[1:]: code for code, spec in _SPECS.items() if spec.name != "bfloat16"}
_SUPPORTED = ", ".join(spec.name for spec in _SPECS.values())


_FLOATS = {tensor_pb2.FLOAT32, tensor_pb2.FLOAT16, tensor_pb2.BFLOAT16, tensor_pb2.FLOAT64}
_INDEX = np.dtype("<i4")  # a sparse tensor's flat positions
# A sparse message without an expected shape may expand to at most this many elements (what
# a dense float32 message of 256 MiB holds): a few bytes on the wire never claim unbounded memory.
SPARSE_MAX_ELEMENTS = 1 << 26

WIRE_FLOATS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def as_received(tensor: torch.Tensor, wire_dtype: str) -> torch.Tensor:
    """What a float32 tensor becomes after travelling as `wire_dtype` (the in-process
    reference's stand-in for encode + decode)."""
    if wire_dtype == "float32":
        return tensor
    return tensor.to(WIRE_FLOATS[wire_dtype]).float()


def _wire_code(dtype: object) -> tensor_pb2.DType.ValueType:
    code: tensor_pb2.DType.ValueType | None = None
    if isinstance(dtype, torch.dtype):
        code = _FROM_TORCH.get(dtype)
    elif isinstance(dtype, np.dtype):
        code = _FROM_NUMPY.get(dtype.str[1:])
    elif isinstance(dtype, int) and dtype in _SPECS:
        code = cast("tensor_pb2.DType.ValueType", dtype)  # a known code: its enum's NewType
    if code is None:
        raise TypeError(f"unsupported tensor dtype {dtype}; supported: {_SUPPORTED}")
    return code


def encode_tensor(tensor: torch.Tensor | np.ndarray, *, sparse: bool = False) -> tensor_pb2.Tensor:
    """Encode a dense tensor (any strides, any device, grad or not) as a Tensor message;
    sparse: send a floating tensor as (indices, values) when that is smaller (density below
    itemsize / (itemsize + 4): ½ for float32, ⅓ for float16). Both forms are exact."""
    if isinstance(tensor, torch.Tensor):
        if tensor.layout != torch.strided:
            raise TypeError(f"only dense tensors can be encoded, got layout {tensor.layout}")
        code = _wire_code(tensor.dtype)
        tensor = tensor.detach().cpu()
        array = (tensor.view(torch.int16) if code == tensor_pb2.BFLOAT16 else tensor).numpy()
    else:
        array = np.asarray(tensor)
        code = _wire_code(array.dtype)
    wire = array.astype(_SPECS[code].wire, copy=False)
    if sparse and code in _FLOATS and 0 < wire.size < 2**31:
        # Nonzero by bit pattern, so -0.0 travels as itself.
        flat = wire.reshape(-1)  # C order, like the dense form
        positions = np.flatnonzero(flat.view(f"<i{wire.itemsize}"))
        if len(positions) * (wire.itemsize + _INDEX.itemsize) < wire.nbytes:
            return tensor_pb2.Tensor(dtype=code, shape=array.shape, sparse=True,
                                     indices=positions.astype(_INDEX).tobytes(),
                                     data=flat[positions].tobytes())
    return tensor_pb2.Tensor(dtype=code, shape=array.shape, data=wire.tobytes(order="C"))


def _format_shape(shape: Collection[int | None]) -> str:
    return "[" + ", ".join("*" if size is None else str(size) for size in shape) + "]"


def _shape_matches(expected: tuple[int | None, ...], dims: list[int]) -> bool:
    if len(expected) != len(dims):
        return False
    return all(want is None or want == size for want, size in zip(expected, dims, strict=True))


def _validated(msg: tensor_pb2.Tensor, field: str, dtype: DType | Collection[DType] | None,
               shape: tuple[int | None, ...] | None, max_elements: int | None = None,
               ) -> tuple[_Spec, list[int], bytes | np.ndarray]:
    """The checks every decode makes: dtype known and allowed, shape, byte length; returns the
    dense payload (the message's bytes, or a sparse message expanded to a flat wire array, of
    at most `max_elements`, or SPARSE_MAX_ELEMENTS where no shape is expected)."""
    spec = _SPECS.get(msg.dtype)
    if spec is None:
        got = tensor_pb2.DType.Name(msg.dtype) if msg.dtype == 0 else f"unknown value {msg.dtype}"
        raise CodecError(f"{field}: dtype is {got}; supported: {_SUPPORTED}")
    dims = list(msg.shape)
    if any(size < 0 for size in dims):
        raise CodecError(f"{field}: shape {dims} has a negative dimension")
    if dtype is not None:
        allowed = list(dtype) if isinstance(dtype, Collection) else [dtype]
        if msg.dtype not in {_wire_code(expected) for expected in allowed}:
            names = ", ".join(_SPECS[_wire_code(expected)].name for expected in allowed)
            raise CodecError(f"{field}: dtype {spec.name}, expected {names}")
    if shape is not None and not _shape_matches(shape, dims):
        raise CodecError(f"{field}: expected shape {_format_shape(shape)}, got {dims}")
    if msg.sparse:
        limit = max_elements if max_elements is not None else (
            SPARSE_MAX_ELEMENTS if shape is None else None)
        return spec, dims, _expanded(msg, field, spec, dims, limit)
    if msg.indices:
        raise CodecError(f"{field}: a dense tensor carries indices; set sparse or drop them")
    data = msg.data  # one access: the runtime may copy the bytes out on every access
    needed = math.prod(dims) * spec.wire.itemsize
    if len(data) != needed:
        raise CodecError(
            f"{field}: data has {len(data)} bytes, shape {dims} {spec.name} needs {needed}"
        )
    return spec, dims, data


def _expanded(msg: tensor_pb2.Tensor, field: str, spec: _Spec, dims: list[int],
              limit: int | None) -> np.ndarray:
    """A sparse message as the flat dense wire array (at most `limit` elements, and 2³¹ − 1
    in any case), after checking every index; nothing is allocated before the checks."""
    if msg.dtype not in _FLOATS:
        raise CodecError(f"{field}: a sparse tensor must be floating, got {spec.name}")
    size = math.prod(dims)
    if size >= 2**31 or (limit is not None and size > limit):
        most = 2**31 - 1 if size >= 2**31 else limit
        raise CodecError(f"{field}: sparse shape {dims} has {size} elements; at most {most}")
    indices, data = msg.indices, msg.data
    if len(indices) % _INDEX.itemsize:
        raise CodecError(f"{field}: indices have {len(indices)} bytes, not a multiple of 4 (int32)")
    count = len(indices) // _INDEX.itemsize
    if len(data) != count * spec.wire.itemsize:
        raise CodecError(f"{field}: {count} indices need {count * spec.wire.itemsize} bytes of "
                         f"{spec.name} values, data has {len(data)}")
    positions = np.frombuffer(indices, dtype=_INDEX)
    if count and (positions[0] < 0 or positions[-1] >= size or not (np.diff(positions) > 0).all()):
        raise CodecError(f"{field}: sparse indices must be strictly increasing positions in "
                         f"[0, {size}) of shape {dims}")
    dense = np.zeros(size, dtype=spec.wire)
    dense[positions] = np.frombuffer(data, dtype=spec.wire)
    return dense


def _reshaped(array: np.ndarray, dims: list[int], field: str) -> np.ndarray:
    try:
        return array.reshape(dims)
    except ValueError as error:  # e.g. [0, 2**62]: zero bytes, but beyond numpy's size limit
        raise CodecError(f"{field}: shape {dims} cannot be represented: {error}") from None


def decode_tensor(
    msg: tensor_pb2.Tensor,
    *,
    field: str,
    dtype: DType | Collection[DType] | None = None,
    shape: tuple[int | None, ...] | None = None,
    finite: bool = False,
    max_elements: int | None = None,
) -> torch.Tensor:
    """Decode and validate a Tensor message into a fresh writable CPU tensor.

    dtype: the expected wire dtype or a collection of allowed ones; shape: the expected
    shape, None entries matching any size; finite: reject NaN and Inf in floating tensors;
    max_elements: the most a sparse message may expand to (checked before any allocation).
    Raises CodecError naming `field` for anything malformed or unexpected.
    """
    spec, dims, data = _validated(msg, field, dtype, shape, max_elements)
    # The single copy out of the immutable bytes; it also fixes byte order on big-endian hosts.
    # A sparse message was expanded into a fresh array already: no second copy.
    expanded = isinstance(data, np.ndarray)
    wire = data if isinstance(data, np.ndarray) else np.frombuffer(
        data, dtype=spec.wire if spec.name != "bool" else np.uint8)
    array = wire != 0 if spec.name == "bool" else wire.astype(spec.wire.newbyteorder("="),
                                                                copy=not expanded)
    array = _reshaped(array, dims, field)
    if finite and spec.torch_dtype.is_floating_point:
        _check_finite(array, field, bfloat16_bits=spec.name == "bfloat16")
    tensor = torch.from_numpy(array)
    return tensor.view(torch.bfloat16) if spec.name == "bfloat16" else tensor


def decode_view(msg: tensor_pb2.Tensor, *, field: str, dtype: DType,
                shape: tuple[int | None, ...] | None = None) -> np.ndarray:
    """A read-only little-endian numpy view of the message's bytes: no copy (for a receiver
    that only stores the tensor, e.g. the sidecar). bfloat16, bool and sparse tensors are not
    viewable."""
    spec, dims, data = _validated(msg, field, dtype, shape)
    if spec.name in ("bfloat16", "bool") or isinstance(data, np.ndarray):
        kind = "sparse" if isinstance(data, np.ndarray) else spec.name
        raise CodecError(f"{field}: a {kind} tensor cannot be viewed without a copy")
    return _reshaped(np.frombuffer(data, dtype=spec.wire), dims, field)


def _check_finite(array: np.ndarray, field: str, *, bfloat16_bits: bool) -> None:
    # numpy, not torch.isfinite: the latter is ~20x slower on CPU at activation sizes.
    # A bfloat16 is NaN or Inf exactly when its eight exponent bits are all ones.
    is_finite = (array & 0x7F80) != 0x7F80 if bfloat16_bits else np.isfinite(array)
    if not is_finite.all():
        bad = np.argwhere(~is_finite)
        first = tuple(int(i) for i in bad[0])
        raise CodecError(
            f"{field}: {len(bad)} non-finite value(s) (NaN or Inf), first at index {first}"
        )


def encode_ids(sample_ids: np.ndarray) -> tensor_pb2.Tensor:
    """Encode a 1-D int64 array of sample ids."""
    if sample_ids.dtype != np.int64 or sample_ids.ndim != 1:
        raise TypeError(
            f"sample ids must be a 1-D int64 array, got {sample_ids.ndim}-D {sample_ids.dtype}"
        )
    return encode_tensor(sample_ids)


def decode_ids(msg: tensor_pb2.Tensor, field: str) -> np.ndarray:
    """Decode a Tensor message that must hold 1-D int64 sample ids."""
    return decode_tensor(msg, field=field, dtype=tensor_pb2.INT64, shape=(None,)).numpy()


def raw_nbytes(msg: tensor_pb2.Tensor) -> int:
    """Payload bytes of a Tensor message (values and sparse indices), without the framing."""
    return len(msg.data) + len(msg.indices)
