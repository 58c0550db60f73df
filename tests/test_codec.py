"""Property tests of the tensor codec: bit-exact round trips and a named error for bad input."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from splitleak.codec import (
    CodecError,
    decode_ids,
    decode_tensor,
    encode_ids,
    encode_tensor,
    raw_nbytes,
)
from splitleak.v1 import tensor_pb2

TORCH_DTYPE = {
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.bool_): torch.bool,
}
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# Up to 4 dims, sides 0..6: covers 0-dim scalars and empty tensors (a 0 in the shape).
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)
NUMPY_ARRAYS = st.sampled_from(sorted(TORCH_DTYPE, key=str)).flatmap(
    lambda dtype: hnp.arrays(dtype, SHAPES)  # default elements include NaN, Inf and extremes
)
SETTINGS = settings(deadline=None, max_examples=150)


def bits(tensor: torch.Tensor) -> bytes:
    """The exact bytes of a tensor in C order, so NaN payloads and -0.0 compare exactly."""
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return tensor.contiguous().numpy().tobytes()


def bfloat16_tensors(shapes=SHAPES) -> st.SearchStrategy[torch.Tensor]:
    """Every bfloat16 bit pattern (subnormals, NaN payloads, +-Inf) is reachable."""
    return hnp.arrays(np.int16, shapes).map(lambda b: torch.from_numpy(b).view(torch.bfloat16))


def over_the_wire(msg: tensor_pb2.Tensor) -> tensor_pb2.Tensor:
    return tensor_pb2.Tensor.FromString(msg.SerializeToString())


@SETTINGS
@given(NUMPY_ARRAYS)
def test_numpy_array_round_trips_bit_exact(array: np.ndarray) -> None:
    msg = over_the_wire(encode_tensor(array))
    decoded = decode_tensor(msg, field="activation")
    assert decoded.dtype == TORCH_DTYPE[array.dtype]
    assert tuple(decoded.shape) == array.shape
    assert list(msg.shape) == list(array.shape)
    assert raw_nbytes(msg) == array.nbytes
    assert bits(decoded) == array.tobytes()


@SETTINGS
@given(NUMPY_ARRAYS)
def test_torch_tensor_round_trips_bit_exact(array: np.ndarray) -> None:
    tensor = torch.from_numpy(array)
    decoded = decode_tensor(encode_tensor(tensor), field="activation")
    assert decoded.dtype == tensor.dtype
    assert decoded.shape == tensor.shape
    assert bits(decoded) == bits(tensor)


@SETTINGS
@given(
    st.one_of(
        bfloat16_tensors(),
        hnp.arrays(np.int16, SHAPES).map(lambda b: torch.from_numpy(b.view(np.float16))),
    )
)
def test_half_precision_round_trips_every_bit_pattern(tensor: torch.Tensor) -> None:
    decoded = decode_tensor(over_the_wire(encode_tensor(tensor)), field="activation")
    assert decoded.dtype == tensor.dtype
    assert decoded.shape == tensor.shape
    assert bits(decoded) == bits(tensor)


def test_scalar_and_empty_tensors_round_trip() -> None:
    scalar = decode_tensor(encode_tensor(torch.tensor(2.5, dtype=torch.bfloat16)), field="loss")
    assert scalar.shape == () and scalar.item() == 2.5 and scalar.dtype == torch.bfloat16
    empty = decode_tensor(encode_tensor(torch.zeros(3, 0, 2)), field="activation")
    assert empty.shape == (3, 0, 2) and empty.dtype == torch.float32


@SETTINGS
@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 5), st.integers(1, 5))), st.data())
def test_non_finite_values_pass_through_unless_checked(array: np.ndarray, data) -> None:
    index = data.draw(st.tuples(*(st.integers(0, n - 1) for n in array.shape)))
    array[index] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    dtype = data.draw(st.sampled_from(FLOAT_DTYPES))
    with warnings.catch_warnings():  # casting huge float64 values overflows to Inf: expected
        warnings.simplefilter("ignore", RuntimeWarning)
        tensor = torch.from_numpy(array).to(dtype)
    msg = encode_tensor(tensor)

    assert bits(decode_tensor(msg, field="cut_gradient")) == bits(tensor)
    non_finite = ~torch.isfinite(tensor)
    first = tuple(int(i) for i in non_finite.nonzero()[0])
    expected = f"cut_gradient: {int(non_finite.sum())} non-finite value(s) (NaN or Inf), first at"
    with pytest.raises(CodecError) as error:
        decode_tensor(msg, field="cut_gradient", finite=True)
    assert str(error.value) == f"{expected} index {first}"


@SETTINGS
@given(st.sampled_from(FLOAT_DTYPES), st.data())
def test_finite_check_accepts_large_finite_values(dtype: torch.dtype, data) -> None:
    info = torch.finfo(dtype)
    values = data.draw(st.lists(st.sampled_from([info.max, -info.max, info.tiny, 0.0, 1.0])))
    tensor = torch.tensor(values, dtype=dtype)
    decoded = decode_tensor(encode_tensor(tensor), field="activation", finite=True)
    assert bits(decoded) == bits(tensor)


def test_finite_check_ignores_integer_tensors() -> None:
    ids = torch.tensor([0, -1, 2**62])
    assert torch.equal(decode_tensor(encode_tensor(ids), field="sample_ids", finite=True), ids)


@SETTINGS
@given(hnp.arrays(np.float32, st.tuples(st.integers(0, 6), st.integers(0, 6))))
def test_non_contiguous_input_round_trips_in_logical_order(array: np.ndarray) -> None:
    transposed = torch.from_numpy(array).t()
    decoded = decode_tensor(encode_tensor(transposed), field="activation")
    assert decoded.shape == transposed.shape
    assert bits(decoded) == bits(transposed)
    reversed_strided = array[::-1, ::2]
    decoded = decode_tensor(encode_tensor(reversed_strided), field="activation")
    assert decoded.numpy().tobytes() == np.ascontiguousarray(reversed_strided).tobytes()


def test_big_endian_numpy_input_goes_on_the_wire_little_endian() -> None:
    array = np.array([1.5, -2.0], dtype=">f4")
    msg = encode_tensor(array)
    assert msg.data == np.array([1.5, -2.0], dtype="<f4").tobytes()
    assert decode_tensor(msg, field="activation").tolist() == [1.5, -2.0]


def test_tensor_that_requires_grad_is_encoded_detached() -> None:
    weights = torch.ones(2, 3, requires_grad=True)
    activation = weights * 3
    decoded = decode_tensor(encode_tensor(activation), field="activation")
    assert not decoded.requires_grad
    assert torch.equal(decoded, torch.full((2, 3), 3.0))


@pytest.mark.parametrize("dtype", [*TORCH_DTYPE.values(), torch.bfloat16])
def test_decoded_tensor_is_writable_and_owns_its_memory(dtype: torch.dtype) -> None:
    msg = encode_tensor(torch.zeros(4, 2, dtype=dtype))
    before = msg.data
    decoded = decode_tensor(msg, field="activation")
    decoded.fill_(1)
    assert bool((decoded == 1).all())
    assert msg.data == before


def test_decoding_never_wraps_the_read_only_protobuf_bytes() -> None:
    # torch warns only once per process about a read-only buffer, so look in a fresh one.
    script = (
        "import torch\n"
        "from splitleak.codec import decode_tensor, encode_tensor\n"
        "for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.uint8):\n"
        "    decode_tensor(encode_tensor(torch.zeros(3, dtype=dtype)), field='a').fill_(1)\n"
    )
    run = subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr


def test_bool_bytes_other_than_zero_and_one_decode_as_true() -> None:
    msg = tensor_pb2.Tensor(dtype=tensor_pb2.BOOL, shape=[3], data=b"\x00\x02\xff")
    assert decode_tensor(msg, field="mask").tolist() == [False, True, True]


def bad_message_error(msg: tensor_pb2.Tensor, **expect) -> str:
    with pytest.raises(CodecError) as error:
        decode_tensor(msg, field="activation", **expect)
    message = str(error.value)
    assert message.startswith("activation: ")
    return message


@pytest.mark.parametrize(
    ("dtype", "words"),
    [(tensor_pb2.DTYPE_UNSPECIFIED, "DTYPE_UNSPECIFIED"), (42, "unknown value 42")],
)
def test_unspecified_or_unknown_dtype_is_rejected(dtype: int, words: str) -> None:
    message = bad_message_error(tensor_pb2.Tensor(dtype=dtype, shape=[1], data=bytes(4)))
    assert words in message
    assert "supported: float32, float16, bfloat16" in message


def test_negative_dimension_is_rejected() -> None:
    msg = tensor_pb2.Tensor(dtype=tensor_pb2.FLOAT32, shape=[2, -1], data=b"")
    assert "negative dimension" in bad_message_error(msg)


@pytest.mark.parametrize("shape", [[0, 2**62], [0, 2**31, 2**31, 2**31], [1] * 65])
def test_shape_too_big_or_too_deep_for_an_array_is_rejected(shape: list[int]) -> None:
    data = bytes(4) if all(shape) else b""
    msg = tensor_pb2.Tensor(dtype=tensor_pb2.FLOAT32, shape=shape, data=data)
    assert "cannot be represented" in bad_message_error(msg)


def test_byte_length_mismatch_message() -> None:
    msg = tensor_pb2.Tensor(dtype=tensor_pb2.FLOAT32, shape=[2, 3], data=bytes(12))
    assert bad_message_error(msg) == "activation: data has 12 bytes, shape [2, 3] float32 needs 24"


@SETTINGS
@given(NUMPY_ARRAYS, st.integers(-16, 16).filter(bool), st.data())
def test_tampered_byte_length_is_caught(array: np.ndarray, delta: int, data) -> None:
    msg = encode_tensor(array)
    if delta < 0 and -delta <= len(msg.data):
        msg.data = msg.data[:delta]
    else:  # grow, also when there are too few bytes to cut
        msg.data += data.draw(st.binary(min_size=abs(delta), max_size=abs(delta)))
    assert "bytes" in bad_message_error(msg)


@SETTINGS
@given(st.sampled_from([*TORCH_DTYPE.values(), torch.bfloat16]), st.data())
def test_dtype_other_than_expected_is_rejected(sent: torch.dtype, data) -> None:
    others = [d for d in (*TORCH_DTYPE.values(), torch.bfloat16) if d != sent]
    allowed = data.draw(st.lists(st.sampled_from(others), min_size=1, max_size=3, unique=True))
    msg = encode_tensor(torch.zeros(2, dtype=sent))
    message = bad_message_error(msg, dtype=allowed if len(allowed) > 1 else allowed[0])
    assert "expected" in message and str(sent).removeprefix("torch.") in message
    assert decode_tensor(msg, field="activation", dtype=[*allowed, sent]).dtype == sent


def test_expected_dtype_may_be_given_as_wire_enum() -> None:
    msg = encode_tensor(torch.zeros(2, dtype=torch.float16))
    assert decode_tensor(msg, field="activation", dtype=tensor_pb2.FLOAT16).dtype == torch.float16
    message = bad_message_error(msg, dtype=[tensor_pb2.FLOAT32, tensor_pb2.BFLOAT16])
    assert message == "activation: dtype float16, expected float32, bfloat16"


@pytest.mark.parametrize(
    ("expected", "ok"),
    [
        ((None, 3), True),
        ((2, 3), True),
        ((None, None), True),
        ((2, 4), False),
        ((None,), False),
        ((2, 3, 1), False),
        ((), False),
    ],
)
def test_shape_other_than_expected_is_rejected(expected: tuple, ok: bool) -> None:
    msg = encode_tensor(torch.zeros(2, 3))
    if ok:
        assert decode_tensor(msg, field="activation", shape=expected).shape == (2, 3)
    else:
        message = bad_message_error(msg, shape=expected)
        assert "expected shape [" in message and message.endswith("got [2, 3]")
        if expected == (None,):
            assert "[*]" in message


@pytest.mark.parametrize(
    "unsupported",
    [
        torch.zeros(2, dtype=torch.complex64),
        np.zeros(2, np.complex128),
        np.zeros(2, np.int16),
        np.array(["a"]),
    ],
)
def test_encode_rejects_unsupported_dtype_listing_supported_ones(unsupported) -> None:
    with pytest.raises(TypeError, match="supported: float32, float16, bfloat16, float64, int64"):
        encode_tensor(unsupported)


@SETTINGS
@given(hnp.arrays(np.int64, st.integers(0, 50)))
def test_sample_ids_round_trip(sample_ids: np.ndarray) -> None:
    decoded = decode_ids(over_the_wire(encode_ids(sample_ids)), "sample_ids")
    assert isinstance(decoded, np.ndarray) and decoded.dtype == np.int64 and decoded.ndim == 1
    assert np.array_equal(decoded, sample_ids)


@pytest.mark.parametrize("sample_ids", [np.zeros((2, 2), np.int64), np.zeros(3, np.int32)])
def test_encode_ids_rejects_non_1d_or_non_int64(sample_ids: np.ndarray) -> None:
    with pytest.raises(TypeError, match="1-D int64"):
        encode_ids(sample_ids)


@pytest.mark.parametrize(
    "msg", [encode_tensor(np.zeros((2, 2), np.int64)), encode_tensor(np.zeros(3, np.float32))]
)
def test_decode_ids_rejects_non_1d_or_non_int64(msg: tensor_pb2.Tensor) -> None:
    with pytest.raises(CodecError, match="^sample_ids: "):
        decode_ids(msg, "sample_ids")


def test_decode_view_matches_decode_without_copying() -> None:
    from splitleak.codec import decode_view

    values = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    msg = encode_tensor(values)
    view = decode_view(msg, field="cut_gradient", dtype=tensor_pb2.FLOAT32, shape=(3, None))
    assert not view.flags.writeable and view.shape == (3, 4)
    np.testing.assert_array_equal(view, values.numpy())
    with pytest.raises(CodecError, match="cut_gradient: dtype float32, expected int64"):
        decode_view(msg, field="cut_gradient", dtype=tensor_pb2.INT64)
    with pytest.raises(CodecError, match="cannot be viewed"):
        decode_view(encode_tensor(values.to(torch.bfloat16)), field="g", dtype=torch.bfloat16)
