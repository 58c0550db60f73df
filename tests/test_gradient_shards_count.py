"""records_before counts a whole shard from its messages' headers (bodies skipped) and walks only
the shard its count ends in: the same counts as walking every record, cut or torn shards
included (what check_log relies on to find a log cut short by hand)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attacker.sidecar.store import GradientStore
from splitleak.artifacts import gradient_shards
from splitleak.artifacts.gradient_shards import records_before, shard_prefix, shards


def _walked(folder: Path, step: int) -> tuple[int, Path | None]:
    """records_before as it was: every shard walked record by record."""
    count, last = 0, None
    for shard in shards(folder):
        prefix = shard_prefix(shard, before_step=step)
        count, last = count + prefix.records, shard
        if not prefix.whole:
            break
    return count, last


@pytest.fixture
def log(tmp_path: Path) -> Path:
    store = GradientStore(tmp_path / "gradients", "r", shard_bytes=3000)
    rng = np.random.default_rng(0)
    for step in range(40):
        rows = 1 if step == 7 else 4
        store.append(1, step // 10, step, np.arange(rows), {"g": rng.random((rows, 16), np.float32)})
    store.close()
    folder = tmp_path / "gradients" / "party_1"
    assert len(shards(folder)) > 3
    return folder


def test_counts_equal_a_walk_of_every_record(log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    walks: list[Path] = []
    walk = gradient_shards.shard_prefix
    monkeypatch.setattr(gradient_shards, "shard_prefix",
                        lambda path, before_step=None: walks.append(path) or walk(path, before_step))
    for step in range(0, 42):
        walks.clear()
        assert records_before(log, step) == _walked(log, step), step
        assert len(walks) <= 1  # only the shard the count ends in is walked
    assert records_before(log, 40)[0] == 40


def test_a_shard_cut_or_torn_anywhere_counts_as_a_walk_does(log: Path) -> None:
    middle = shards(log)[1]
    data = middle.read_bytes()
    for cut in sorted({0, 1, 4, 7, 8, 9, 100, len(data) // 2, len(data) - 9, len(data) - 8,
                       len(data) - 4, len(data) - 1} | set(range(0, len(data), 97))):
        middle.write_bytes(data[:cut])
        for step in (5, 20, 40):
            assert records_before(log, step) == _walked(log, step), (cut, step)
    middle.write_bytes(data[:len(data) // 2] + b"\0" * (len(data) - len(data) // 2))
    assert records_before(log, 40) == _walked(log, 40)
    middle.unlink()
    assert records_before(log, 40) == _walked(log, 40)
