"""`[wire] sparse`: a tensor travels as (int32 positions, values) when that is smaller; exact in
both forms, every index checked on decode, and never more memory than the shape allows."""

from __future__ import annotations

import json
from pathlib import Path

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attacker.sidecar.store import GradientLog
from splitleak.codec import SPARSE_MAX_ELEMENTS, CodecError, decode_tensor, decode_view, encode_tensor
from splitleak.v1 import tensor_pb2
from tests.conftest import small_config
from tests.runs import distributed_and_reference

FLOATS = st.sampled_from([np.float32, np.float16, np.float64])
SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=8)


def _sparse_array(dtype, shape, density: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape).astype(dtype)
    return np.where(rng.random(shape) < density, values, np.zeros((), dtype)).astype(dtype)


def _wire(msg: tensor_pb2.Tensor) -> tensor_pb2.Tensor:
    return tensor_pb2.Tensor.FromString(msg.SerializeToString())


@settings(deadline=None, max_examples=150)
@given(FLOATS, SHAPES, st.floats(0, 1), st.integers(0, 2**32 - 1))
def test_round_trip_is_bit_exact_and_sparse_only_when_smaller(dtype, shape, density, seed) -> None:
    array = _sparse_array(dtype, shape, density, seed)
    msg = _wire(encode_tensor(array, sparse=True))
    decoded = decode_tensor(msg, field="g").numpy()
    assert decoded.dtype == array.dtype and decoded.tobytes() == array.tobytes()
    nonzero = int(np.count_nonzero(array.view(f"i{array.itemsize}")))
    smaller = nonzero * (array.itemsize + 4) < array.nbytes
    assert msg.sparse == smaller
    dense = encode_tensor(array)
    assert not dense.sparse and len(msg.data) + len(msg.indices) <= len(dense.data)


def test_float32_switches_below_half_density_and_keeps_negative_zero() -> None:
    row = np.zeros(100, np.float32)
    row[:48] = 1.0
    row[60] = -0.0  # nonzero by bit pattern: travels as itself
    msg = encode_tensor(row, sparse=True)
    assert msg.sparse and len(msg.indices) == 49 * 4 and len(msg.data) == 49 * 4
    assert decode_tensor(msg, field="g").numpy().tobytes() == row.tobytes()
    row[48] = 1.0  # density ½: dense is as small, so it stays dense
    assert not encode_tensor(row, sparse=True).sparse


def test_bfloat16_and_torch_tensors_go_sparse_too() -> None:
    tensor = torch.zeros(16, 8, dtype=torch.bfloat16)
    tensor[3, 2], tensor[9, 7] = 1.5, -2.25
    msg = encode_tensor(tensor, sparse=True)
    assert msg.sparse and len(msg.indices) == 8
    decoded = decode_tensor(msg, field="g", shape=(16, 8))
    assert torch.equal(decoded, tensor)
    decoded[0, 0] = 7.0  # a fresh, writable tensor
    assert decode_tensor(msg, field="g", shape=(16, 8))[0, 0] == 0


def _sparse_msg(shape, indices, values, dtype=tensor_pb2.FLOAT32) -> tensor_pb2.Tensor:
    return tensor_pb2.Tensor(dtype=dtype, shape=shape, sparse=True,
                             indices=np.asarray(indices, "<i4").tobytes(),
                             data=np.asarray(values, "<f4" if dtype == tensor_pb2.FLOAT32
                                             else "<i8").tobytes())


@pytest.mark.parametrize(("msg", "words"), [
    (_sparse_msg([4], [0, 0], [1.0, 2.0]), "strictly increasing"),
    (_sparse_msg([4], [2, 1], [1.0, 2.0]), "strictly increasing"),
    (_sparse_msg([4], [1, 4], [1.0, 2.0]), "[0, 4)"),
    (_sparse_msg([4], [-1], [1.0]), "[0, 4)"),
    (_sparse_msg([4], [1, 2], [1.0]), "need 8 bytes"),
    (_sparse_msg([4], [1], [7], dtype=tensor_pb2.INT64), "must be floating"),
    (tensor_pb2.Tensor(dtype=tensor_pb2.FLOAT32, shape=[4], sparse=True, indices=b"\0\0\0"),
     "multiple of 4"),
    (tensor_pb2.Tensor(dtype=tensor_pb2.FLOAT32, shape=[1], data=b"\0" * 4, indices=b"\0" * 4),
     "dense tensor carries indices"),
    # A few bytes may not claim gigabytes: without an expected shape the expansion is capped.
    (_sparse_msg([SPARSE_MAX_ELEMENTS + 1], [], []), "at most"),
    (_sparse_msg([2**20, 2**20], [], []), "at most"),
])
def test_malformed_sparse_tensor_is_rejected_naming_the_field(msg, words: str) -> None:
    with pytest.raises(CodecError) as err:
        decode_tensor(_wire(msg), field="cut gradient (step 3)")
    assert "cut gradient (step 3)" in str(err.value) and words in str(err.value)


def test_expected_shape_is_checked_before_anything_is_allocated() -> None:
    huge = _sparse_msg([2**25, 2**5], [], [])
    with pytest.raises(CodecError, match=r"expected shape \[1024, 128\]"):
        decode_tensor(huge, field="g", shape=(1024, 128))
    assert decode_tensor(_sparse_msg([1024, 128], [5], [1.0]), field="g",
                         shape=(1024, 128)).sum() == 1.0


def test_a_sparse_tensor_is_not_viewable() -> None:
    with pytest.raises(CodecError, match="sparse tensor cannot be viewed"):
        decode_view(_sparse_msg([4], [1], [1.0]), field="g", dtype=tensor_pb2.FLOAT32)


@pytest.mark.slow
def test_sparse_wire_changes_bytes_never_values(tmp_path: Path) -> None:
    """The `sparsify` defense over a sparse wire: the log and the model equal the in-process
    reference's exactly (a lossless encoding), and fewer bytes cross than a dense run sends."""
    for sub in ("sparse", "dense"):
        (tmp_path / sub).mkdir()
    def config(sub: str, sparse: bool) -> dict:
        return small_config(tmp_path / sub, training={"batch_size": 32, "epochs": 1, "max_steps": 4},
                            defense=[{"name": "sparsify", "kept_fraction": 0.1}],
                            attacker={"record_activation": True}, wire={"sparse": sparse})

    distributed, reference = distributed_and_reference(tmp_path / "sparse", config("sparse", True))
    dense, _ = distributed_and_reference(tmp_path / "dense", config("dense", False))
    logs = [list(GradientLog(r.attacker / "gradients").batches(1))
            for r in (distributed, reference, dense)]
    assert [b.step for b in logs[0]] == [0, 1, 2, 3]
    for ours, theirs, plain in zip(*logs, strict=True):
        assert (ours.tensors["cut_gradient"] != 0).mean() < 0.5  # it did travel sparse
        for name in ("cut_gradient", "activation"):
            np.testing.assert_array_equal(ours.tensors[name], theirs.tensors[name])
            np.testing.assert_array_equal(ours.tensors[name], plain.tensors[name])
    sent = [json.loads((r.root / "label_party" / "outcome.json").read_text())["bytes_sent"]
            for r in (distributed, dense)]
    assert sent[0] < 0.6 * sent[1]
