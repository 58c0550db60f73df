"""A sweep point stopped after its training finished but before its processes were collected
(its outcome says ok, it has no summary.json) resumes from its newest checkpoint, as an
interrupted point does, instead of training again from step 0 (engine.resume_run_dir)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from orchestration.sweep.engine import resume_run_dir
from orchestration.sweep.points import Point
from splitleak.artifacts.outcome import read_outcome
from splitleak.checkpoint import complete_manifests
from tests.live import whole_run
from tests.test_checkpoints import fresh_run
from tests.test_resume_data import spam_config, spam_file


def test_a_point_trained_but_not_collected_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    spam_file(tmp_path / "spam.data", seed=0)
    cfg = spam_config(tmp_path, str(tmp_path / "spam.data"))
    run = fresh_run(cfg, tmp_path / "point")
    outcome, errors = asyncio.run(whole_run(cfg, run.root))
    assert outcome["status"] == "ok" and errors == [None, None]
    assert not run.summary.exists()  # the sweep's worker was stopped before it wrote one
    newest = complete_manifests(run.root)[-1]

    resumed, flags, note = resume_run_dir(Point(0, "v", (), (), cfg, run.root))
    assert flags == ("--resume",), note
    assert note == f"resuming the point's earlier attempt at step {newest.step} (periodic checkpoint)"
    assert resumed.root == run.root and complete_manifests(run.root)[-1] == newest
    assert read_outcome(run) == {}  # the roles' resume would refuse a run whose outcome says ok
