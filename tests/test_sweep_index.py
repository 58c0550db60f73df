"""sweep.parquet (resume by hash, retry of failed points, atomic rewrites) and what a Ray role
actor streams back (the role host, without Ray)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from orchestration.sweep import roles
from orchestration.sweep.index import SweepIndex, read_index
from orchestration.sweep.points import Point, resolve
from orchestration.sweep.roles import RoleError, RoleHost, receive
from orchestration.sweep.scratch import remove_scratch
from orchestration.sweep.spec import parse_sweep
from splitleak.artifacts.sweep import SweepIndexError
from splitleak.config import parse_config
from tests.conftest import small_config


def _points(tmp_path: Path, seeds: list[int]) -> list[Point]:
    sweep = parse_sweep({"sweep": {"name": "s", "seeds": seeds}})
    return resolve(sweep, parse_config(small_config(tmp_path)), tmp_path / "s")


def _finish(point: Point) -> None:
    """The outputs a finished point leaves (what `finished` checks)."""
    (point.run_dir / "report").mkdir(parents=True)
    (point.run_dir / "summary.json").write_text("{}")


def test_resume_by_hash_and_retry_failed(tmp_path: Path) -> None:
    points = _points(tmp_path, [0, 1, 2, 3])
    index = SweepIndex(tmp_path / "s", points, "local")
    assert index.todo(points, retry_failed=False) == points
    _finish(points[0])
    index.mark(points[0], "done", 12.5)
    index.mark(points[1], "failed", 3.0, "passive party 2 exited with code 1")
    index.mark(points[2], "running")
    rows = read_index(tmp_path / "s")
    assert [r["status"] for r in rows] == ["done", "failed", "running", "pending"]
    assert rows[1]["message"] == "passive party 2 exited with code 1" and rows[0]["seconds"] == 12.5
    assert rows[0]["run_dir"] == points[0].hash and json.loads(rows[0]["overrides"]) == {"run.seed": 0}

    # a new sweep over the same points, in another order, with one more: matched by hash
    more = _points(tmp_path, [3, 2, 1, 0, 4])
    again = SweepIndex(tmp_path / "s", more, "local")
    by_seed = {p.seed: p for p in more}
    assert again.todo(more, retry_failed=False) == [by_seed[3], by_seed[2], by_seed[4]]
    assert again.todo(more, retry_failed=True) == [by_seed[3], by_seed[2], by_seed[1], by_seed[4]]
    assert again.rows[points[1].hash]["message"] == "passive party 2 exited with code 1"
    # a finished point whose run directory is gone runs again
    (points[0].run_dir / "summary.json").unlink()
    assert by_seed[0] in again.todo(more, retry_failed=False)
    assert again.counts() == {"pending": 2, "running": 1, "done": 1, "failed": 1}
    with pytest.raises(ValueError, match="allowed: pending"):
        again.mark(points[0], "finished")


def test_every_change_rewrites_a_readable_index(tmp_path: Path) -> None:
    points = _points(tmp_path, [0, 1])
    index = SweepIndex(tmp_path / "s", points, "ray")
    index.mark(points[1], "done", 1.0, nodes={"label_party": {"node_id": "a"}})
    table = pq.read_table(tmp_path / "s" / "sweep.parquet")
    assert table.num_rows == 2 and table.column("engine").to_pylist() == ["ray", "ray"]
    assert json.loads(table.column("nodes")[1].as_py()) == {"label_party": {"node_id": "a"}}
    assert not list((tmp_path / "s").glob(".*.tmp"))  # the temporary sibling was renamed over


def test_an_unreadable_index_is_named(tmp_path: Path) -> None:
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "sweep.parquet").write_text("not parquet")
    with pytest.raises(SweepIndexError, match="not a readable sweep index"):
        SweepIndex(tmp_path / "s", _points(tmp_path, [0]), "local")


def test_role_files_stream_back_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(roles, "CHUNK_BYTES", 7)
    cfg = parse_config(small_config(tmp_path))
    host = RoleHost(roles.passive_role(1), cfg.to_toml(), "abc123", identity={"ca.pem": b"ca"})
    try:
        assert host.run.root.name == "abc123" and host.streamed
        assert (host.tls_dir / "ca.pem").stat().st_mode & 0o777 == 0o600
        files = {"passive_party_1/bottom.pt": bytes(range(30)), "passive_party_1/empty": b"",
                 "passive_party_1/seven": b"1234567"}
        for name, data in files.items():
            (host.run.root / name).parent.mkdir(parents=True, exist_ok=True)
            (host.run.root / name).write_bytes(data)
        pieces = list(host.files())
        assert max(len(data) for _, _, data in pieces) == 7
        out = tmp_path / "driver" / "abc123"
        written = receive(out, iter(pieces))
        assert written == 37
        for name, data in files.items():
            assert (out / name).read_bytes() == data
        assert (out / "logs" / "passive_party_1.log").exists()  # the role's own log comes back too
    finally:
        host.cleanup()
    assert not host.tls_dir.exists()
    with pytest.raises(RoleError, match="outside the run directory"):
        receive(tmp_path / "driver" / "abc123", iter([("../../escape", 0, b"x")]))
    assert not (tmp_path / "escape").exists()


def test_a_role_that_fails_says_why_in_its_own_words(tmp_path: Path) -> None:
    """A role that ended with an error code was reported as 'attacker exited with code 1 (see
    logs/attacker.log)': the point's error gave no reason, which sat in that log on the node."""
    cfg = parse_config(small_config(tmp_path, topology={"passive_parties": 1, "join_deadline_s": 3,
                                                        "tls": False}, features={"passive": [[0, 30]]}))
    host = RoleHost("attacker", cfg.to_toml(), "abc123", str(tmp_path / "abc123"))
    try:
        host.start("127.0.0.1")  # no party ever joins: it gives up after twice the deadline
        deadline = time.monotonic() + 30
        while not (status := host.poll())["done"] and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        host.cleanup()
    assert status["code"] == 1 and status["error"] == (
        "attacker exited with code 1: stopped before passive party 1 finished streaming"), status


def test_a_role_in_a_process_of_its_own_logs_its_output(tmp_path: Path) -> None:
    """A Ray role's stdout and stderr (a crash's last words, a library's warnings) went to Ray's
    files on its node; they go to the role's log, where its failure is looked for, as a
    `splitleak run` party's do."""
    config = tmp_path / "config.toml"
    config.write_text(parse_config(small_config(tmp_path)).to_toml())
    child = f"""
import os, sys
from pathlib import Path
from orchestration.sweep.roles import RoleHost
host = RoleHost("passive_party_1", Path({str(config)!r}).read_text(), "abc123", {str(tmp_path / "abc123")!r})
host.capture_output()
print("a line on stdout")
os.write(2, b"Fatal Python error: Segmentation fault\\n")
sys.stdout.flush()
print(host.last_words(), file=open({str(tmp_path / "words")!r}, "w"))
host.cleanup()
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0 and not done.stdout and not done.stderr, done
    log = (tmp_path / "abc123" / "logs" / "passive_party_1.log").read_text()
    assert "a line on stdout\nFatal Python error: Segmentation fault\n" in log, log
    assert (tmp_path / "words").read_text() == "Fatal Python error: Segmentation fault\n"


def test_a_point_left_out_and_given_again_keeps_its_finished_run(tmp_path: Path) -> None:
    """A value taken off an axis drops its points from the index; put back, their finished
    run directories (result.json done, report, summary) count as done, not as runs to redo."""
    from splitleak.artifacts.sweep import PointResult, write_result

    points = _points(tmp_path, [0, 1])
    index = SweepIndex(tmp_path / "s", points, "local")
    _finish(points[1])
    write_result(points[1].run_dir, PointResult("done", 4.0, None))
    index.mark(points[1], "done", 4.0)
    SweepIndex(tmp_path / "s", points[:1], "local").write()  # seed 1 left out
    assert [r["seed"] for r in read_index(tmp_path / "s")] == [0]
    again = SweepIndex(tmp_path / "s", points, "local")  # and given again
    assert again.todo(points, retry_failed=False) == points[:1]
    assert again.rows[points[1].hash]["seconds"] == 4.0


def test_a_sweep_file_edited_to_leave_points_out_says_which(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """seeds = [0, 1] run, then the file edited to seeds = [0]: the rerun dropped seed 1 from
    the index (and so from the comparison) without a word. It now names the points it no
    longer has; a rerun of the same file says nothing of the kind."""
    import tomli_w

    from orchestration.cli import main
    from splitleak.artifacts.sweep import PointResult, write_result
    from tests.conftest import write_config

    base = write_config(tmp_path, small_config(tmp_path))
    points = _points(tmp_path, [0, 1])
    index = SweepIndex(tmp_path / "s", points, "local")
    for point in points:
        _finish(point)
        write_result(point.run_dir, PointResult("done", 4.0, None))
        index.mark(point, "done", 4.0)
    file = tmp_path / "sweep.toml"
    file.write_text(tomli_w.dumps({"sweep": {"name": "s", "base": str(base), "seeds": [0],
                                             "output_dir": str(tmp_path)}}))
    for said in (True, False):
        assert main(["sweep", str(file), "--engine", "inprocess", "--no-compare"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "0 run now, 1 skipped" in out, out
        assert ("the sweep file no longer has 1 point of its earlier run (t, seed=1 (done)): "
                "they leave the index and its comparison; their run directories are kept" in out
                ) is said, out
    assert [r["seed"] for r in read_index(tmp_path / "s")] == [0]
    assert (points[1].run_dir / "summary.json").exists()


def _node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path/node as this node's temporary directory, where roles keep their scratch."""
    monkeypatch.setenv("TMPDIR", str(tmp_path / "node"))
    monkeypatch.setattr(roles.tempfile, "tempdir", None)  # read TMPDIR again
    (tmp_path / "node").mkdir()
    return tmp_path / "node"


def _killed(config: Path, host: str, then: str = "") -> None:
    """A process that hosts a role (`host`: a RoleHost of `config`, `then`: what it does next) and
    is then killed with SIGKILL, as `kill -9` of a Ray actor: no cleanup()."""
    child = f"""
import os, signal
from pathlib import Path
from orchestration.sweep.roles import RoleHost
config = Path({str(config)!r}).read_text()
host = {host}
{then}
os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == -9, done


def test_a_killed_roles_scratch_is_removed_by_its_sweep(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A role whose process was killed never removed its scratch (tempfile.mkdtemp
    'splitleak-passive_party_1-*' in the node's temporary directory, kept for ever); it lies in
    the sweep's folder, per point, which the engine removes on the node whatever the role's end."""
    node = _node(tmp_path, monkeypatch)
    cfg = parse_config(small_config(tmp_path))
    config = tmp_path / "config.toml"
    config.write_text(cfg.to_toml())
    _killed(config, 'RoleHost("passive_party_1", config, "abc123", identity={"ca.pem": b"ca"}, '
                    'sweep="splitleak-sweep-1")',
            '(host.run.root / "passive_party_1").mkdir()\n'
            '(host.run.root / "passive_party_1" / "bottom.pt").write_bytes(b"weights")')
    left = sorted(p.relative_to(node).as_posix() for p in node.iterdir())
    assert left == ["splitleak-sweep-1"], left  # nothing else in the node's temporary directory
    other = RoleHost("attacker", cfg.to_toml(), "def456", sweep="splitleak-sweep-1")
    remove_scratch("splitleak-sweep-1", "abc123")
    assert [p.name for p in (node / "splitleak-sweep-1").iterdir()] == ["def456"]
    other.cleanup()  # the last point's roles: the sweep's folder goes too
    assert not any(node.iterdir())


def test_a_dead_roles_scratch_is_removed_by_the_next_role_on_its_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep whose driver was killed with SIGKILL never removed its points' scratch, and Ray
    killed their actors with the driver: the folders stayed in the node's temporary directory.
    The next role on the node removes those whose process is gone, never a living role's."""
    node = _node(tmp_path, monkeypatch)
    cfg = parse_config(small_config(tmp_path))
    config = tmp_path / "config.toml"
    config.write_text(cfg.to_toml())
    _killed(config, 'RoleHost("passive_party_1", config, "abc123", sweep="splitleak-sweep-1")')
    living = RoleHost("attacker", cfg.to_toml(), "abc123", sweep="splitleak-sweep-2")
    try:
        RoleHost("label_party", cfg.to_toml(), "def456", sweep="splitleak-sweep-3").cleanup()
        assert (node / "splitleak-sweep-1").exists()  # it might be starting still
        monkeypatch.setattr(roles, "ABANDONED_AFTER_S", 0.0, raising=False)
        RoleHost("label_party", cfg.to_toml(), "def456", sweep="splitleak-sweep-3").cleanup()
        assert sorted(p.name for p in node.iterdir()) == ["splitleak-sweep-2"]
        assert living.run.root.is_dir()
    finally:
        living.cleanup()
    assert not any(node.iterdir())


def test_a_role_starts_where_a_dead_role_of_its_point_was_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A point's only folder was a dead role's: removing it removed the point's folder just made
    for the new role, whose mkdtemp then failed with FileNotFoundError."""
    node = _node(tmp_path, monkeypatch)
    cfg = parse_config(small_config(tmp_path))
    config = tmp_path / "config.toml"
    config.write_text(cfg.to_toml())
    _killed(config, 'RoleHost("passive_party_1", config, "abc123", sweep="splitleak-sweep-1")')
    monkeypatch.setattr(roles, "ABANDONED_AFTER_S", 0.0, raising=False)
    again = RoleHost("passive_party_1", cfg.to_toml(), "abc123", sweep="splitleak-sweep-1")
    try:
        assert [p.name for p in (node / "splitleak-sweep-1" / "abc123").iterdir()] == \
            [again.run.root.parent.name]
    finally:
        again.cleanup()
    assert not any(node.iterdir())
