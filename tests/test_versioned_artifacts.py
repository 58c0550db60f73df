"""The checkpoint manifest and the gradient log's index refuse a file of another format, or
not JSON, with an error naming the file; each reads its own format back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from splitleak.artifacts.gradient_index import (
    GradientLogIndex,
    LogIndexError,
    PartyLog,
    read_index,
    write_index_text,
)
from splitleak.artifacts.manifest import Manifest, ManifestError, read_manifest, write_manifest
from splitleak.artifacts.paths import CHECKPOINT_MANIFEST, RunDir


def test_a_manifest_reads_back_and_refuses_another_format(tmp_path: Path) -> None:
    manifest = Manifest(step=4, batches=6, metrics_records=7, run_id="r", config_hash="h",
                        config={}, files={"label_party.pt": "0" * 64})
    path = write_manifest(RunDir(tmp_path), manifest)
    assert path.name == CHECKPOINT_MANIFEST and read_manifest(path) == manifest
    path.write_text(json.dumps({**manifest.model_dump(), "format": 2}))
    with pytest.raises(ManifestError, match=r"format 2; this version reads format 1"):
        read_manifest(path)
    path.write_text("{not json")
    with pytest.raises(ManifestError, match=r"manifest.json is not a readable checkpoint manifest"):
        read_manifest(path)
    path.write_text(json.dumps({"format": 1, "step": "four"}))
    with pytest.raises(ManifestError, match="is not a readable checkpoint manifest"):
        read_manifest(path)
    with pytest.raises(ManifestError, match="is not a readable checkpoint manifest"):
        read_manifest(tmp_path / "missing.json")  # a resume says why, not a traceback


def test_a_gradient_log_index_reads_back_and_refuses_another_format(tmp_path: Path) -> None:
    path = tmp_path / "index.json"
    index = GradientLogIndex(run_id="r", parties={"1": PartyLog(shapes={"cut_gradient": [4]})})
    path.write_text(write_index_text(index))
    assert read_index(path) == index
    path.write_text(json.dumps({"format": 3, "parties": {}}))
    with pytest.raises(LogIndexError, match=r"index.json: a gradient log index of format 3"):
        read_index(path)
    path.write_text("[]")
    with pytest.raises(LogIndexError, match="format None"):
        read_index(path)
    with pytest.raises(FileNotFoundError):  # the sidecar's reopen checks the file exists first
        read_index(tmp_path / "missing.json")


def test_a_summary_is_strict_json_with_null_where_a_figure_is_not_a_number(tmp_path: Path) -> None:
    """An attack whose premise failed has no AUC: the file says null, not NaN (which JSON has
    not, and other languages' parsers refuse), and reads back equal to what was written."""
    from attacker.analysis.summary import write_summary
    from splitleak.artifacts.summary import read_leak_summary

    run = RunDir(tmp_path)
    run.report.mkdir()
    entry = {"party_id": 1, "layer": "first", "attack": "norm", "scope": "run",
             "flipped": {"mean": float("nan"), "p95": float("inf")}, "n": 0}
    write_summary(run, {"leak": [entry], "warnings": []})

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in {run.leak_summary}")

    text = run.leak_summary.read_text()
    assert json.loads(text, parse_constant=refuse)["leak"][0]["flipped"] == {"mean": None, "p95": None}
    assert read_leak_summary(run) == read_leak_summary(run)
