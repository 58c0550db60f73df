"""Clean anchors for the cosine oracle: the label party's seeded draw, the artifact, and the
analysis using the clean (pre-defense) gradient, equal to the received one only without a defense."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attacker.analysis.analyze import analyze
from attacker.analysis.leak import evaluate_batch
from attacker.attacks import build_attack
from attacker.attacks.checks import needed_artifacts
from attacker.sidecar.store import GradientLog
from orchestration.reference import run_reference
from splitleak.anchors import (
    BatchAnchors,
    CleanAnchors,
    CleanAnchorWriter,
    draw_anchor_rows,
    read_clean_anchors,
)
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import create_run_dir
from splitleak.config import ConfigError, parse_config
from splitleak.validation import validate
from tests.conftest import small_config


def test_draw_picks_positives_with_replacement_and_is_seeded() -> None:
    labels = np.array([0, 1, 0, 0, 1, 0])
    rows = draw_anchor_rows(labels, seed=3, party_id=1, step=7, draws=5)
    assert rows.size == 5 and set(rows.tolist()) <= {1, 4}
    np.testing.assert_array_equal(rows, draw_anchor_rows(labels, 3, 1, 7, 5))
    others = [draw_anchor_rows(labels, 3, 1, step, 5).tolist() for step in range(8, 14)]
    assert any(o != rows.tolist() for o in others)  # another step, another draw
    assert draw_anchor_rows(np.zeros(4), 3, 1, 7, 5).size == 0


def _anchor_parties(tmp_path: Path, **sections: object) -> list[int] | None:
    return validate(parse_config(small_config(tmp_path, **sections))).cfg.evaluation.clean_anchors


def test_the_resolved_config_names_the_anchor_parties_the_declared_attacks_need(tmp_path: Path) -> None:
    assert _anchor_parties(tmp_path) == [1]  # the default attacks include the cosine oracle
    assert _anchor_parties(tmp_path, attacker={"attacks": ["norm"]}) == []
    assert _anchor_parties(tmp_path, attacker={"attacks": ["norm", "cosine_oracle"]}) == [1]
    assert _anchor_parties(tmp_path, attacker={"enabled": False}) == []
    assert _anchor_parties(tmp_path, evaluation={"clean_anchors": []}) == []  # given: kept
    cfg = parse_config(small_config(tmp_path))
    assert needed_artifacts(cfg, 2) == {"clean_anchors"}
    assert needed_artifacts(cfg, 10) == set()  # multi-class: no score attack runs


def test_the_evaluation_section_is_resolved_once_and_checked(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path))
    with pytest.raises(ConfigError, match="unresolved"):
        cfg.artifacts  # noqa: B018  (a role never runs an unresolved config)
    resolved = validate(cfg).cfg
    assert resolved.artifacts.white_box_snapshots == [] == resolved.artifacts.received_activations
    assert validate(resolved).cfg == resolved  # a run directory's config.toml resolves to itself
    assert cfg.hash == resolved.hash == parse_config(tomllib.loads(resolved.to_toml())).hash
    with pytest.raises(ConfigError, match=r"evaluation.clean_anchors names \[2\], which are not tapped"):
        validate(parse_config(small_config(tmp_path, evaluation={"clean_anchors": [2]})))
    with pytest.raises(ConfigError, match="evaluation.white_box_snapshots = \\[1\\] disagrees"):
        validate(parse_config(small_config(tmp_path, evaluation={"white_box_snapshots": [1]})))


def test_artifact_round_trips_and_survives_a_torn_tail(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path, threat={"draws": 3}))
    path = tmp_path / "anchors.arrows"
    writer = CleanAnchorWriter(path, cfg, [1])
    gradients = np.arange(12, dtype=np.float32).reshape(4, 3)
    writer.record(1, 0, 5, np.array([40, 41, 42, 43]), np.array([0, 1, 1, 0]), gradients)
    writer.record(2, 0, 5, np.array([40, 41, 42, 43]), np.array([0, 1, 1, 0]), gradients)  # not tapped
    writer.record(1, 0, 6, np.array([1, 2]), np.array([0, 0]), gradients[:2])  # no positive
    writer.close()
    found, warning = read_clean_anchors(path)
    assert warning is None and list(found) == [(1, 5)]
    anchors = found[(1, 5)]
    assert anchors.sample_ids.size == 3 and set(anchors.sample_ids.tolist()) <= {41, 42}
    for sample_id, gradient in zip(anchors.sample_ids, anchors.gradients, strict=True):
        np.testing.assert_array_equal(gradient, gradients[sample_id - 40])
    path.write_bytes(path.read_bytes()[:-20])
    found, warning = read_clean_anchors(path)
    assert found == {} and "unreadable after 0 complete" in warning
    assert read_clean_anchors(tmp_path / "absent.arrows") == ({}, None)


def _run(tmp_path: Path, defense: list[dict]) -> RunDir:
    cfg = parse_config(small_config(tmp_path, defense=defense, threat={"draws": 3},
                                    training={"epochs": 3, "batch_size": 32}))
    run = create_run_dir(cfg, suffix="-" + (defense[0]["name"] if defense else "none"))
    run_reference(cfg, run)
    return run


def _with_anchor(run: RunDir, use_clean: bool) -> list[float]:
    """The cosine oracle's per-batch AUC with the label party's anchors, the anchor vector being
    the clean gradient or the received row of the same sample."""
    anchors, _ = read_clean_anchors(run.clean_anchors)
    labels = analyze_labels(run)
    attack = build_attack("cosine_oracle", {})
    aucs = []
    for batch in GradientLog(run.attacker / "gradients").batches(1):
        found = anchors[(1, batch.step)]
        grads = batch.tensors["cut_gradient"]
        for draw, sample_id in enumerate(found.sample_ids):
            row = int(np.flatnonzero(batch.sample_ids == sample_id)[0])
            anchor = found.gradients[draw] if use_clean else grads[row]
            leak = evaluate_batch(attack, grads, labels[batch.sample_ids], np.random.default_rng(0),
                                  (row, anchor))
            aucs.append(leak.auc.raw if leak.auc else np.nan)
    return aucs


def analyze_labels(run: RunDir) -> np.ndarray:
    table = pq.read_table(run.labels).to_pydict()
    lookup = np.full(max(table["sample_id"]) + 1, -1)
    lookup[table["sample_id"]] = table["label"]
    return lookup


def test_clean_anchor_equals_received_without_a_defense_and_differs_under_marvell(
        tmp_path: Path) -> None:
    plain, marvell = _run(tmp_path, []), _run(tmp_path, [{"name": "marvell", "s": 4.0}])
    for run in (plain, marvell):
        anchors, _ = read_clean_anchors(run.clean_anchors)
        steps = [b.step for b in GradientLog(run.attacker / "gradients").batches(1)]
        assert set(steps) <= {step for _, step in anchors} and len(anchors) >= len(steps) - 1
        assert all(a.sample_ids.size == 3 for a in anchors.values())
    # No defense: the clean gradient is the received one, bit for bit, and so is the leak.
    assert np.array_equal(_with_anchor(plain, True), _with_anchor(plain, False), equal_nan=True)
    # Marvell: the received anchor carries Marvell's noise; the clean one does not.
    clean, received = np.array(_with_anchor(marvell, True)), np.array(_with_anchor(marvell, False))
    assert not np.allclose(clean, received, equal_nan=True)
    # The analysis reads the artifact: draw r uses anchor r, and nothing falls back.
    summary = analyze(marvell.root, [("cosine_oracle", {})])
    assert not any("no clean anchor" in w for w in summary["warnings"])
    entry = next(e for e in summary["leak"] if e["scope"] == "run" and e["layer"] == "cut")
    assert entry["draws"] == 3 and "spread" in entry
    per_draw = np.nanmean(clean.reshape(-1, 3), axis=0)  # batches in order, three draws each
    assert entry["raw"]["mean"] == pytest.approx(per_draw.mean(), abs=1e-9)


@pytest.mark.parametrize("damage", ["absent", "garbage", "shorter"])
def test_under_a_defense_a_draw_without_a_clean_anchor_is_skipped_and_said(
        tmp_path: Path, damage: str) -> None:
    """The oracle's premise is a clean anchor: under Marvell the received row is a noised one,
    so a draw the artifact lacks is skipped with the reason, never scored with that row."""
    run = _run(tmp_path, [{"name": "marvell", "s": 4.0}])
    whole = analyze(run.root, [("cosine_oracle", {})], draws=2)
    if damage == "absent":
        run.clean_anchors.unlink()
    else:  # garbage, or the first batch of anchors and the start of the next
        size = 200 if damage == "garbage" else _first_anchors_end(run.clean_anchors) + 40
        run.clean_anchors.write_bytes(b"\xff{garbage" * 20 if damage == "garbage"
                                      else run.clean_anchors.read_bytes()[:size])
    summary = analyze(run.root, [("cosine_oracle", {})], draws=2)
    (missing,) = [w for w in summary["warnings"] if "had no clean anchor" in w]
    assert "clean_anchors.arrows" in missing and "skipped" in missing, missing
    if damage != "absent":
        assert any(str(run.clean_anchors) in w and "unreadable after" in w
                   for w in summary["warnings"]), summary["warnings"]
    cut = next(e for e in summary["leak"] if e["scope"] == "run" and e["layer"] == "cut")
    before = next(e for e in whole["leak"] if e["scope"] == "run" and e["layer"] == "cut")
    assert not cut.get("received_anchors")
    if damage == "shorter":  # the first batch keeps its clean anchors and its figures
        assert "premise" not in cut and cut["skipped"] == cut["batches"] - 1
        assert cut["flipped"]["n"] == 1 and before["flipped"]["n"] == cut["batches"]
    else:
        assert "no clean anchor" in cut["premise"] and cut["skipped"] == cut["batches"]
    rows = pq.read_table(run.attacker / "leak.parquet").to_pylist()
    assert all(r["anchor"] != "received" for r in rows)


def _first_anchors_end(path: Path) -> int:
    """The byte offset just after the file's first batch of anchors."""
    with pa.OSFile(str(path), "rb") as source:
        reader = pa.ipc.MessageReader.open_stream(source)
        reader.read_next_message()  # the schema
        reader.read_next_message()
        return source.tell()


def test_a_resumed_writer_keeps_the_earlier_steps_and_rewrites_the_rest(tmp_path: Path) -> None:
    """A run resumed at step 3 redoes steps 3.. : the records before step 3 stay as the first
    attempt wrote them, what it wrote after (steps 3, 4 and a torn tail) is replaced."""
    cfg = parse_config(small_config(tmp_path))
    labels = np.array([1, 0, 1, 1, 0, 0, 1, 0])

    def write(writer: CleanAnchorWriter, steps: range, scale: float = 1.0) -> None:
        for step in steps:
            gradient = np.arange(16, dtype=np.float32).reshape(8, 2) * (step + 1) * scale
            writer.record(1, 0, step, np.arange(8) + 10 * step, labels, gradient)

    whole = CleanAnchorWriter(tmp_path / "whole.arrows", cfg, [1])
    write(whole, range(6))
    whole.close()
    path = tmp_path / "resumed.arrows"
    first = CleanAnchorWriter(path, cfg, [1])
    write(first, range(5), scale=-1.0)  # steps 3 and 4 differ from what the resumed run computes
    first.close()
    with path.open("ab") as torn:
        torn.write(b"\x00\x01\x02")
    resumed = CleanAnchorWriter(path, cfg, [1])
    resumed.keep_before(3)
    write(resumed, range(3, 6))
    resumed.close()

    expected, _ = read_clean_anchors(tmp_path / "whole.arrows")
    found, warning = read_clean_anchors(path)
    assert warning is None and sorted(found) == sorted(expected) == [(1, s) for s in range(6)]
    for key, anchors in expected.items():
        np.testing.assert_array_equal(found[key].sample_ids, anchors.sample_ids)
        # steps 0-2 kept from the first attempt (its scale -1), 3-5 rewritten
        sign = -1.0 if key[1] < 3 else 1.0
        np.testing.assert_array_equal(found[key].gradients, sign * anchors.gradients)


def test_a_batch_without_a_positive_is_no_fallback_to_a_received_anchor() -> None:
    """The README's breast-cancer run warned that '5 batch draw(s) had no clean anchor' under
    Marvell: its last batch of an epoch held 7 negatives, so the label party drew no anchor, and
    the analysis counted each draw as falling back to a received row, though nothing did (the
    batch is skipped as single-class)."""
    from collections import defaultdict
    from types import SimpleNamespace

    from attacker.analysis.analyze import NO_CLEAN_ANCHOR, _anchors

    analysis = SimpleNamespace(anchors={}, perturbed=True, missing_anchors=defaultdict(int),
                               draws=1)
    unit = SimpleNamespace(parties=(1,))
    batch = SimpleNamespace(step=47, sample_ids=np.arange(7))
    attack = build_attack("cosine_oracle", {})
    assert _anchors(analysis, unit, batch, "cut", attack, positive=False) == [(None, None)]
    assert not analysis.missing_anchors
    assert _anchors(analysis, unit, batch, "cut", attack, positive=True) == [
        (None, NO_CLEAN_ANCHOR)]
    assert analysis.missing_anchors == {("cosine_oracle", "cut"): 1}


def _equal(found: BatchAnchors | None, expected: BatchAnchors | None) -> bool:
    if found is None or expected is None:
        return found is expected
    return (np.array_equal(found.sample_ids, expected.sample_ids)
            and np.array_equal(found.gradients, expected.gradients))


def test_the_analysis_reads_clean_anchors_along_holding_one_batch(tmp_path: Path) -> None:
    """CleanAnchors answers what the whole file read at once answers, walking each party's steps
    in order (the analysis's walk), going back for another party, after a torn tail and for a
    file whose steps do not ascend; it holds one batch of anchors, not the file's."""
    cfg = parse_config(small_config(tmp_path, threat={"draws": 4}))
    path = tmp_path / "anchors.arrows"
    writer = CleanAnchorWriter(path, cfg, [1, 2])
    rng = np.random.default_rng(7)
    for step in range(40):
        for party in (1, 2):
            labels = rng.integers(0, 2, 16) if step % 7 else np.zeros(16)  # some steps: none
            writer.record(party, step // 10, step, np.arange(16) + 100 * step, labels,
                          rng.normal(size=(16, 5)).astype(np.float32))
    writer.close()
    whole, _ = read_clean_anchors(path)
    streamed = CleanAnchors(path)
    assert streamed.warning is None
    for party in (1, 2, 1):  # party 1 again: read from the start
        for step in range(40):
            for _ in range(2):  # each draw and attack asks again for the same batch
                assert _equal(streamed.get((party, step)), whole.get((party, step)))
        assert streamed.get((party, 99)) is None
    assert streamed._whole is None and streamed._current is not None  # noqa: SLF001 - read along
    streamed.close()
    assert streamed._reader is None  # noqa: SLF001 - the file is closed
    assert _equal(streamed.get((1, 3)), whole.get((1, 3)))  # and read again when asked

    path.write_bytes(path.read_bytes()[:-30])  # a torn tail
    whole, warning = read_clean_anchors(path)
    torn = CleanAnchors(path)
    assert torn.warning == warning and f"unreadable after {len(whole)} complete" in warning
    assert all(_equal(torn.get((2, step)), whole.get((2, step))) for step in range(40))

    backwards = CleanAnchorWriter(tmp_path / "backwards.arrows", cfg, [1])
    for step in (3, 1, 2):
        backwards.record(1, 0, step, np.arange(4), np.array([1, 0, 1, 0]), np.eye(4, dtype=np.float32))
    backwards.close()
    found = CleanAnchors(tmp_path / "backwards.arrows")
    assert found._whole is not None  # noqa: SLF001 - read whole, as before
    assert [found.get((1, step)) is not None for step in (1, 2, 3)] == [True, True, True]
    assert CleanAnchors(tmp_path / "absent.arrows").get((1, 0)) is None


def test_an_oracle_never_scored_for_want_of_anchors_is_not_applicable_despite_a_batch_without_a_positive(
        ) -> None:
    """Every draw skipped for its missing anchor but one batch with no positive (skipped as
    single-class, needing no anchor): the attack was never scored, so its premise is the reason."""
    from attacker.analysis.analyze import MISSING_ANCHOR
    from attacker.analysis.summary import _premise

    rows = pa.table({"skip_kind": ["premise", "single_class", "premise"],
                     "skip_reason": [f"premise: {MISSING_ANCHOR}", "single class in batch (all 0)",
                                     f"premise: {MISSING_ANCHOR}"]})
    assert _premise(rows) == MISSING_ANCHOR
    assert _premise(rows.slice(1)) == MISSING_ANCHOR
    scored = pa.table({"skip_kind": ["premise", None], "skip_reason": [f"premise: {MISSING_ANCHOR}", None]})
    assert _premise(scored) is None


def test_a_full_disk_names_the_anchor_file(tmp_path: Path) -> None:
    """The label party, its disk full, said "cannot write: Error writing bytes to file. Detail:
    [errno 28] No space left on device": pyarrow names no file. Now the file and the full disk
    are named, for the anchors and for a pyarrow file written atomically."""
    from splitleak.fileio import describe_os_error, write_atomically
    from tests.test_cli_refusals import full_directory

    cfg = parse_config(small_config(tmp_path))
    with full_directory(tmp_path) as full:
        path = full / "clean_anchors.arrows"
        writer = CleanAnchorWriter(path, cfg, [1])
        labels = np.ones(64, dtype=np.int64)
        with pytest.raises(OSError) as caught:
            for step in range(1000):  # the stream's first bytes may fit a page the filler left
                writer.record(1, 0, step, np.arange(64), labels, np.ones((64, 256), np.float32))
        said = describe_os_error(caught.value)
        assert said == (f"cannot write {path}: No space left on device (the disk or the "
                        "file-size limit is full)"), said
        table = pa.table({"x": np.zeros(1 << 16)})
        with pytest.raises(OSError) as caught:
            write_atomically(full / "labels.parquet", lambda tmp: pq.write_table(table, tmp))
        said = describe_os_error(caught.value)
        assert said.startswith(f"cannot write {full / 'labels.parquet'}: No space left"), said
