"""`[wire]`: activations and gradients travel as float16 / bfloat16, compressed or not; the
sidecar logs what the passive party received, and the in-process reference rounds the same way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from attacker.sidecar.store import GradientLog
from splitleak.codec import as_received, decode_tensor, encode_tensor
from splitleak.config import ConfigError, parse_config
from tests.conftest import small_config
from tests.runs import distributed_and_reference


@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
def test_as_received_is_the_encode_decode_round_trip(wire: str) -> None:
    values = torch.tensor([[1e-3, -2.5e-5, 3.14159, 1e-9], [65000.0, -7.0, 0.1, 1 / 3]])
    travelled = decode_tensor(encode_tensor(values.to(getattr(torch, wire))), field="t").float()
    assert torch.equal(as_received(values, wire), travelled)
    assert not torch.equal(travelled, values)  # lossy: it is a compression
    assert as_received(values, "float32") is values


def test_wire_options_are_validated(tmp_path: Path) -> None:
    for wire, word in [({"dtype": "int8"}, "float16"), ({"compression": "zstd"}, "gzip"),
                       ({"sparse": "maybe"}, "sparse")]:
        with pytest.raises(ConfigError) as err:
            parse_config(small_config(tmp_path, wire=wire))
        assert "wire" in str(err.value) and word in str(err.value)


def _exactly(values: np.ndarray, wire: str) -> bool:
    """True when every value is representable in `wire` (a float16 / bfloat16 round trip)."""
    return np.array_equal(as_received(torch.from_numpy(values.copy()), wire).numpy(), values)


@pytest.mark.slow
@pytest.mark.parametrize(("wire", "compression"), [("float16", "gzip"), ("bfloat16", "none")])
def test_distributed_run_over_a_narrow_wire_matches_the_reference(tmp_path: Path, wire: str,
                                                                   compression: str) -> None:
    data = small_config(tmp_path, training={"batch_size": 32, "epochs": 1, "max_steps": 4},
                        attacker={"record_activation": True},
                        wire={"dtype": wire, "compression": compression})
    distributed, reference = distributed_and_reference(tmp_path, data)
    logs = [list(GradientLog(r.attacker / "gradients").batches(1)) for r in (distributed, reference)]
    assert [b.step for b in logs[0]] == [b.step for b in logs[1]] == [0, 1, 2, 3]
    for ours, theirs in zip(*logs, strict=True):
        for name in ("cut_gradient", "activation"):  # what crossed the wire, as it arrived
            assert ours.tensors[name].dtype == np.float32
            assert _exactly(ours.tensors[name], wire), name
            np.testing.assert_allclose(ours.tensors[name], theirs.tensors[name], rtol=1e-2, atol=1e-6)
