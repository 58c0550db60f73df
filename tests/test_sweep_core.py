"""What sweeps need from the core and the label party: dataset.subset, training.eval_train, TLS
identities valid for cluster nodes."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509

from label_party.schedule import Phase, make_plan, schedule
from label_party.setup import load_label_party_data
from orchestration.reference import run_reference
from splitleak import tls
from splitleak.artifacts.rundir import create_run_dir
from splitleak.artifacts.sweep import PointResult
from splitleak.config import ConfigError, parse_config
from splitleak.datasets import train_test_ids
from tests.conftest import small_config


def test_subset_config(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path, dataset={"name": "breast_cancer", "subset": 0.3}))
    assert cfg.dataset.subset.fraction == 0.3 and cfg.dataset.subset.seed is None
    for bad in (True, 0, 1.5, {"fraction": 0.5, "seed": -1}, {"share": 0.5}):
        with pytest.raises(ConfigError, match="dataset.subset"):
            parse_config(small_config(tmp_path, dataset={"name": "breast_cancer", "subset": bad}))


def test_subset_draws_the_same_rows_for_the_same_seed(tmp_path: Path) -> None:
    def data(**overrides):
        return load_label_party_data(parse_config(small_config(tmp_path, **overrides)))

    subset = {"name": "breast_cancer", "test_fraction": 0.25, "subset": 0.3}
    full = data(dataset={"name": "breast_cancer", "test_fraction": 0.25})
    part = data(dataset=subset)
    assert part.train_ids.size == round(0.3 * full.train_ids.size) == 128
    assert part.test_ids.size == round(0.3 * full.test_ids.size)
    assert np.isin(part.train_ids, full.train_ids).all() and np.isin(part.test_ids, full.test_ids).all()
    assert (np.diff(part.train_ids) > 0).all()
    assert part.plan.steps_per_epoch == 2  # 128 rows in batches of 64
    paired = data(dataset=subset, defense=[{"name": "marvell", "s": 4.0}])
    assert np.array_equal(paired.train_ids, part.train_ids)  # a Δ or a defense sees the same rows
    other = data(dataset=subset, run={"seed": 4})
    assert not np.array_equal(other.train_ids, part.train_ids)
    pinned = data(dataset={**subset, "subset": {"fraction": 0.3, "seed": 4}})
    other_split = train_test_ids(569, 0.25, 3)[0]  # the split still follows run.seed = 3
    assert np.isin(pinned.train_ids, other_split).all()
    assert not np.array_equal(pinned.train_ids, part.train_ids)


def test_the_last_evaluation_scores_the_train_rows_when_asked(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path, training={"eval_train": True, "epochs": 1}))
    data = load_label_party_data(cfg)
    batches = list(schedule(make_plan(cfg, data.train_ids.size), data.train_ids, data.test_ids, 3))
    evals = [b for b in batches if b.phase is Phase.EVAL]
    ends = [i + 1 for i, b in enumerate(evals) if b.last_of_eval][:-1]
    passes = np.split(np.array(evals, dtype=object), ends)
    assert all(b.split == "test" for p in passes[:-1] for b in p)
    last = passes[-1]
    assert [b.split for b in last] == ["test"] * 3 + ["train"] * 7
    assert np.array_equal(np.concatenate([b.sample_ids for b in last if b.split == "train"]), data.train_ids)
    assert sum(b.last_of_eval for b in last) == 1 and last[-1].last_of_eval

    run = create_run_dir(cfg)
    run_reference(cfg, run)
    records = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    final = [r for r in records if r["type"] == "eval"]
    assert "train_auc" not in final[0] and final[-1]["train_rows"] == data.train_ids.size
    assert final[-1]["train_auc"] > 0.8 and final[-1]["test_rows"] == data.test_ids.size
    plain = parse_config(small_config(tmp_path, training={"epochs": 1}))
    plan = make_plan(plain, data.train_ids.size)
    assert all(b.split == "test" for b in schedule(plan, data.train_ids, data.test_ids, 3))


def test_identities_can_name_cluster_nodes(tmp_path: Path) -> None:
    tls.generate(tmp_path, ["label-party"], hosts=["10.1.2.3", "node-7.cluster", "127.0.0.1"])
    cert = x509.load_pem_x509_certificate((tmp_path / "label-party.pem").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("10.1.2.3")}
    assert set(names.get_values_for_type(x509.DNSName)) == {"label-party", "localhost", "node-7.cluster"}



def _sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # the handler runs here


def test_a_stopped_point_worker_ignores_a_repeated_sigterm(tmp_path: Path, monkeypatch) -> None:
    """A second SIGTERM (the lifeline's, as the sweep exits) while the worker ends its stopped
    point raised KeyboardInterrupt, e.g. in an atexit handler: a traceback in the point's log."""
    from orchestration.sweep import worker

    def stopped_point(*args, **kwargs) -> PointResult:
        with pytest.raises(KeyboardInterrupt):
            _sigterm()  # the sweep stops the point
        _sigterm()  # and again while the point stops
        return PointResult("interrupted", 0.0, "stopped by the sweep")

    monkeypatch.setattr(worker, "setup_logging", lambda role: None)
    monkeypatch.setattr(worker, "run_point", stopped_point)
    monkeypatch.setattr(worker, "write_result", lambda run_dir, result: _sigterm())
    kept = signal.getsignal(signal.SIGTERM)
    try:
        assert worker.main([str(tmp_path)]) == 130
    finally:
        signal.signal(signal.SIGTERM, kept)
