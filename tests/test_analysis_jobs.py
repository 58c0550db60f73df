"""`attacker analyze --jobs J`: the batch attacks in J worker processes write the same files, byte
for byte, as one process does, fail as it fails, and stop on Ctrl-C without leaving a worker."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from attacker.analysis import parallel
from attacker.analysis.analyze import Analysis, analyze, default_attacks
from attacker.analysis.inputs import AnalysisInputError
from attacker.attacks.norm import NormAttack
from attacker.bench.analysis import write_synthetic_run
from attacker.cli import main
from attacker.sidecar.store import GradientStore
from orchestration.reference import run_reference
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.rundir import create_run_dir
from splitleak.config import parse_config
from splitleak.stopping import Terminated
from tests.conftest import scaled, small_config

BAD = 1e6  # a gradient entry that makes _Refuses refuse its batch


class _Refuses(NormAttack):
    """The norm attack, refusing a batch that holds a gradient entry of BAD (a bad batch)."""

    def __call__(self, gradients, side):  # type: ignore[no-untyped-def]
        if gradients.max() >= BAD:
            raise AnalysisInputError(f"a gradient entry of {gradients.max():g}: not a gradient")
        return super().__call__(gradients, side)


@pytest.fixture
def pool_on_short_logs(monkeypatch: pytest.MonkeyPatch) -> list[parallel.WorkerPool]:
    """Workers for any log, in chunks of 2 batches (many chunks, the in-flight bound reached);
    the pools the analysis started."""
    started: list[parallel.WorkerPool] = []

    class Recorded(parallel.WorkerPool):
        def __enter__(self):  # type: ignore[no-untyped-def]
            started.append(self)
            return super().__enter__()

    monkeypatch.setattr(parallel, "SERIAL_BELOW", 0)
    monkeypatch.setattr(parallel, "CHUNK_BATCHES", 2)
    monkeypatch.setattr(parallel, "WorkerPool", Recorded)
    return started


def _outputs(run: RunDir, summary: dict) -> tuple[bytes, bytes, str]:
    return run.leak.read_bytes(), run.leak_rows.read_bytes(), repr(summary)


def test_two_workers_write_what_one_process_writes(tmp_path: Path, pool_on_short_logs) -> None:
    # 2 parties and their colluding group, Marvell (clean anchors differ from the received
    # rows), 3 draws, 3 epochs, every default attack and one run once per epoch.
    threat = {"draws": 3, "collusion": [[1, 2]], "parties": {"1": {}, "2": {}}}
    cfg = parse_config(small_config(tmp_path, defense=[{"name": "marvell", "s": 4.0}], threat=threat,
                                    training={"epochs": 3, "batch_size": 32}))
    run = create_run_dir(cfg)
    run_reference(cfg, run)
    assert run.clean_anchors.exists()
    attacks = [*default_attacks(2), ("clustering", {"scope": "epoch"})]
    one = _outputs(run, analyze(run.root, attacks, jobs=1))
    assert not pool_on_short_logs
    two = _outputs(run, analyze(run.root, attacks, jobs=2))
    assert pool_on_short_logs, "no worker pool was started"
    assert two == one
    leak = pq.read_table(run.leak, columns=["parties", "attack", "draw", "anchor"]).to_pylist()
    assert {r["parties"] for r in leak} == {"1", "2", "1+2"}
    assert {r["draw"] for r in leak} == {0, 1, 2} and "clean" in {r["anchor"] for r in leak}
    assert "clustering(scope=epoch)" in {r["attack"] for r in leak}


def test_the_parent_sends_a_batch_once_and_samples_only_the_plotted_batches(
        tmp_path: Path, pool_on_short_logs, monkeypatch: pytest.MonkeyPatch) -> None:
    """With J workers the parent cost ~0.9 ms a train step: it sent a batch's gradients once per
    attack (16 work items a batch, each pickled), drew each attack's anchors draw by draw, and
    computed norms and cosines of every batch for a histogram of the first and last 5; it now
    sends one item a batch layer and computes the sample for the batches kept alone."""
    from attacker.analysis import analyze as analysis

    run = write_synthetic_run(tmp_path / "run", rows=64 * 40, dim=8, batch_size=64)
    submitted, sampled = [], []
    submit, draw = parallel.WorkerPool.submit, analysis.attack_rng

    def counted_submit(pool: parallel.WorkerPool, item: object) -> None:
        submitted.append(item)
        submit(pool, item)

    def counted_rng(seed: int, step: int, party: int | str, stream: str) -> np.random.Generator:
        if stream.endswith(":sample"):
            sampled.append(step)
        return draw(seed, step, party, stream)

    monkeypatch.setattr(parallel.WorkerPool, "submit", counted_submit)
    monkeypatch.setattr(analysis, "attack_rng", counted_rng)
    analyze(run.root, jobs=2)
    assert pool_on_short_logs, "no worker pool was started"
    assert len(submitted) == 40, len(submitted)  # one layer (the cut) a batch
    assert sorted(sampled) == [0, 1, 2, 3, 4, 35, 36, 37, 38, 39], sampled
    leak = pq.read_table(run.leak, columns=["step", "attack"]).to_pylist()
    assert len({r["attack"] for r in leak}) > 1 and {r["step"] for r in leak} == set(range(40))


def _squared(offset: int, item: int) -> list[int]:
    return [item * item + offset]


def test_the_pool_hands_rows_on_in_order_with_a_bounded_few_chunks_in_flight() -> None:
    emitted: list[int] = []
    in_flight: list[int] = []
    with parallel.WorkerPool(2, _squared, 1, emitted.extend) as pool:
        for batch in range(50):
            pool.add([-batch])  # the parent's own rows, between the workers'
            for item in range(3):
                pool.submit(batch * 3 + item)
            pool.end_batch()
            in_flight.append(pool._in_flight)
        pool.add([-50])
    expected: list[int] = []
    for batch in range(50):
        expected += [-batch, *(i * i + 1 for i in range(batch * 3, batch * 3 + 3))]
    assert emitted == [*expected, -50]
    assert max(in_flight) == parallel.IN_FLIGHT * 2  # reached, never passed


def _refusing_run(root: Path, monkeypatch: pytest.MonkeyPatch) -> RunDir:
    """12 batches of 30 rows: batch 2 holds a bad gradient (refused in a worker), batch 10's
    sample ids have no label (refused by the parent, after batch 2's chunk was sent)."""
    run = RunDir(root)
    run.label_party.mkdir(parents=True)
    run.config.write_text('[run]\nseed = 5\n')
    rng = np.random.default_rng(0)
    pq.write_table(pa.table({"sample_id": np.arange(300), "label": rng.integers(0, 2, 300),
                             "split": ["train"] * 300}), run.labels)
    store = GradientStore(run.gradients, "refused")
    for step in range(12):
        cut = rng.standard_normal((30, 4)).astype(np.float32)
        cut[0, 0] = BAD if step == 2 else cut[0, 0]
        store.append(1, 0, step, np.arange(step * 30, (step + 1) * 30), {"cut_gradient": cut})
    store.close()
    monkeypatch.setattr(Analysis, "batch_attacks",
                        lambda self, unit: [_Refuses(NormAttack.Params())])
    return run


def test_an_error_in_a_worker_reads_as_in_one_process(tmp_path: Path, pool_on_short_logs,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    run = _refusing_run(tmp_path / "run", monkeypatch)
    said = {}
    for jobs in (1, 2):
        with pytest.raises(SystemExit) as stop:
            main(["analyze", str(run.root), "--jobs", str(jobs)])
        said[jobs] = (stop.value.code, capsys.readouterr())
        assert not run.leak.exists() and not list(run.attacker.glob(".leak*"))  # no partial file
    assert pool_on_short_logs
    assert said[2] == said[1]
    code, (_, err) = said[1]
    # batch 2's error, not batch 10's: one process meets it first
    assert code == 2 and "a gradient entry of 1e+06: not a gradient" in err, err


def test_jobs_is_a_count_of_processes_or_auto(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    for given in ("0", "-1", "two", "1.5"):
        with pytest.raises(SystemExit) as stop:
            main(["analyze", str(tmp_path), "--jobs", given])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "--jobs" in err and "allowed: auto (every core this process may use) or 1..1024" in err


def _processes_under(pid: int) -> set[int]:
    """Every live descendant of `pid`, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.slow
def test_ctrl_c_stops_the_workers(tmp_path: Path) -> None:
    run = write_synthetic_run(tmp_path / "run", rows=64 * 2 * parallel.SERIAL_BELOW, dim=64,
                              batch_size=64)
    child = subprocess.Popen([sys.executable, "-m", "attacker", "analyze", str(run.root), "--jobs",
                              "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        # The forkserver and its 2 workers: the analysis is under way once they are there.
        workers: set[int] = set()
        for _ in range(int(scaled(600))):  # 60 s at most
            workers = _processes_under(child.pid)
            if len(workers) >= 3 or child.poll() is not None:
                break
            try:
                child.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                pass
        assert len(workers) >= 3, f"no workers started: {workers}"
        os.killpg(child.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group
        output = child.communicate(timeout=scaled(30))[0].decode()
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == 130, output
    assert "Traceback" not in output, output  # no worker cut off in its start
    assert "stopped by Ctrl-C: the run's previous analysis" in " ".join(output.split()), output
    assert not run.leak.exists() and not list(run.attacker.glob(".analysis-*"))
    # the workers end before the analysis does; the forkserver once it sees the analysis gone
    alive = [pid for pid in workers if not _ended(pid, scaled(10))]
    assert not alive, f"worker processes left running: {alive}"


def _ended(pid: int, timeout: float) -> bool:
    """Whether process `pid` ends (or has ended) within `timeout` seconds."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([handle], [], [], timeout)[0])
    finally:
        os.close(handle)


def test_the_workers_ignore_ctrl_c_from_their_first_instruction() -> None:
    """A Ctrl-C that lands while a worker starts must not kill it half-started (the analysis then
    waited on it for ever): the forkserver starts with SIGINT ignored, so each worker it forks
    ignores it before it runs any of our code; the analysis's own handler is left as it was."""
    probe = ("import signal\n"
             "from concurrent.futures import ProcessPoolExecutor\n"
             "from attacker.analysis import parallel\n"
             "with ProcessPoolExecutor(1, mp_context=parallel._forkserver()) as pool:\n"
             "    worker = pool.submit(signal.getsignal, signal.SIGINT).result()\n"
             "print(worker == signal.SIG_IGN,\n"
             "      signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n")
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           timeout=scaled(120), check=True)
    assert found.stdout.split() == ["True", "True"], found.stderr


def test_ctrl_c_waits_for_a_submit_to_end_then_stops_the_analysis() -> None:
    """A submit may be starting a worker: Ctrl-C during it is raised once it ends (a worker cut
    off in its start printed a traceback once the analysis was gone: 12 of 14 Ctrl-Cs did so at
    1.2-3.2 s into an analysis with --jobs 2, none now)."""
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with parallel._ctrl_c_held():  # noqa: SLF001
            os.kill(os.getpid(), signal.SIGINT)
            reached.append("the block's end")
    assert reached == ["the block's end"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigterm_waits_for_a_submit_to_end_then_stops_the_analysis() -> None:
    """attacker analyze stops on SIGTERM as on Ctrl-C: a SIGTERM during a submit is raised once it
    ends, through the handler that was in place (before: it cut the worker's start off)."""
    from splitleak.stopping import Terminated, sigterm_interrupts

    reached = []
    with sigterm_interrupts(), pytest.raises(Terminated):
        with parallel._ctrl_c_held():  # noqa: SLF001
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("the block's end")
    assert reached == ["the block's end"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize(("signum", "raised"), [(signal.SIGINT, KeyboardInterrupt),
                                                (signal.SIGTERM, Terminated)])
def test_a_stop_during_a_submit_is_raised_when_it_ends_even_with_no_handler_of_ours(
        signum: int, raised: type[BaseException]) -> None:
    """A SIGTERM that came while a worker started was dropped when no handler of the analysis
    was installed (the default one cannot be replayed): the analysis went on."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(raised):
            with parallel._ctrl_c_held():
                os.kill(os.getpid(), signum)
                ended = True  # the block itself runs to its end
        assert ended
    finally:
        signal.signal(signal.SIGTERM, previous)
