"""`splitleak run`: every party as its own process on loopback, one run directory."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestration.launch import RELAY, address_files, launch_plan
from orchestration.processes import Child, spawn, stop_all, stop_one
from orchestration.progress import RunProgress
from splitleak import tls
from splitleak.artifacts.metrics import MetricsTail, read_metrics, truncate_records
from splitleak.artifacts.outcome import read_outcome, write_outcome
from splitleak.artifacts.paths import RunDir, timing_file
from splitleak.artifacts.records import write_pids
from splitleak.artifacts.rundir import exclusive
from splitleak.artifacts.summary import TrainingSummary, write_training_summary
from splitleak.artifacts.timing import read_timing_file
from splitleak.checkpoint import newest_fields
from splitleak.cli_common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_PARTY_STOPPED
from splitleak.config import ExperimentConfig
from splitleak.fileio import write_atomically

if TYPE_CHECKING:
    from splitleak.checkpoint import Manifest

# After the first process fails, the others get this long to end on their own (the label
# party names the party that broke the run in its outcome); then every process is stopped.
STOP_GRACE = 5.0
# On Ctrl-C the label party gets this long, past its step deadline, to checkpoint and stop.
INTERRUPT_GRACE = 10.0


class RunFailed(Exception):
    """The run did not finish; the message names the failing party and why. `exit_code`: 2
    when the process that failed first refused its input (a data file, an unusable run
    directory: it exited 2), else 1."""

    def __init__(self, message: str, culprit: Child | None = None) -> None:
        super().__init__(message)
        self.culprit = culprit.name if culprit is not None else None
        bad_input = culprit is not None and culprit.returncode == EXIT_BAD_INPUT
        self.exit_code = EXIT_BAD_INPUT if bad_input else EXIT_FAILED


@dataclass
class RunOutcome:
    run: RunDir
    mode: str
    seconds: float
    train_steps: int
    final_eval: dict[str, Any] | None
    training_seconds: float = 0.0  # from the first batch to the last train step

    @property
    def steps_per_second(self) -> float:
        return self.train_steps / self.training_seconds if self.training_seconds else 0.0


def run_distributed(cfg: ExperimentConfig, run: RunDir, progress: RunProgress | None = None,
                    poll: float = 0.1, route: Callable[[str], str] | None = None,
                    resume: bool = False,
                    resuming: Callable[[Manifest | None], None] | None = None) -> RunOutcome:
    """Start every role of the launch plan at once; wait for all; raise RunFailed (RunInUse
    when another process runs or resumes `run`). `route`: the parties reach the label party
    at route(its address) instead. `resume`: continue the run in `run` from its newest
    complete checkpoint; `resuming` is told which (None: step 0) once the run is held."""
    with exclusive(run):
        return _run_distributed(cfg, run, progress, poll, route, resume, resuming)


def _run_distributed(cfg: ExperimentConfig, run: RunDir, progress: RunProgress | None,
                     poll: float, route: Callable[[str], str] | None, resume: bool,
                     resuming: Callable[[Manifest | None], None] | None = None) -> RunOutcome:
    started = time.monotonic()
    launched = time.time()
    children: list[Child] = []
    for stale in address_files(cfg, run):  # a resumed run's old addresses
        stale.unlink(missing_ok=True)
    if resume:
        _cut_metrics_back(cfg, run, resuming)
        run.outcome.unlink(missing_ok=True)  # the attempt before's: never this one's reason
    failure: RunFailed | None = None
    try:
        if cfg.topology.tls:  # a fresh CA and one identity per process, for this run only
            tls.generate(run.tls, tls.identities(cfg.topology.passive_parties),
                         run_scoped=True)  # each process deletes its own key once loaded
        for role in launch_plan(cfg, run, resume, routed=route is not None):
            children.append(spawn(role.name, list(role.args), run.logs / role.log,
                                  essential=role.essential, serves=role.serves))
        _write_pids(run, children)
        if route is not None:  # e.g. through the benchmark's byte-counting relay
            address = _wait_for_address(run.label_party_address, children[0],
                                        cfg.topology.join_deadline_s)
            write_atomically(run.routed_address, lambda tmp: tmp.write_text(route(address)))
        try:
            _monitor(children, run, progress, poll)
        except KeyboardInterrupt:
            _interrupt(children, cfg.topology.step_deadline_s + INTERRUPT_GRACE)
            raise
        failure = _failure(children, run)
    except RunFailed as err:  # a process ended before it served
        failure = err
    finally:
        stop_all(children)
        if cfg.topology.tls:  # certificates stay; private keys do not outlive the run
            tls.remove_private_keys(run.tls)
    if failure is not None:
        _record_failure(run, failure)
        raise failure
    return collect_outcome(run, "distributed", time.monotonic() - started, launched)


def _cut_metrics_back(cfg: ExperimentConfig, run: RunDir,
                      resuming: Callable[[Manifest | None], None] | None = None) -> None:
    """Cut the metrics back to the resumed checkpoint before any role starts, as the label
    party will: the progress tail then never reads a line the label party cuts. Every party
    keeps its checkpoints in this run directory, so one a party's file is gone from is passed
    over, and removed with any newer one, so that the label party resumes from the same one.
    `resuming` is told the checkpoint (this is where a resume is first sure of it)."""
    from splitleak.checkpoint import CheckpointError, discard_after, resume_point

    try:
        manifest = resume_point(run.root, cfg, every_party=True)
    except CheckpointError:
        return  # the label party refuses the run and says why
    if manifest is not None:  # under the run's lock: no other process writes a checkpoint now
        discard_after(run.root, manifest.position)
    truncate_records(run.metrics, manifest.metrics_records if manifest else 0)
    if resuming is not None:
        resuming(manifest)


def _interrupt(children: list[Child], timeout: float) -> None:
    """Ctrl-C: the label party first, so it can checkpoint every party (a second Ctrl-C
    stops everything at once)."""
    label = children[0]
    try:
        stop_one(label, timeout)
    except KeyboardInterrupt:
        pass


def _write_pids(run: RunDir, children: list[Child]) -> None:
    """Which process is which party: for the user, and for the fault tests."""
    write_pids(run, {c.name: c.process.pid for c in children})


def _wait_for_address(port_file: Path, child: Child, timeout: float) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if port_file.exists():
            return port_file.read_text().strip()
        if child.returncode is not None:
            raise RunFailed(f"{child.name} {child.how_it_ended()} before serving: "
                            f"{child.last_error() or '(no output)'}", child)
        time.sleep(0.05)
    raise RunFailed(f"{child.name} did not start serving within {timeout:g} s:\n{child.log_tail()}")


def _monitor(children: list[Child], run: RunDir, progress: RunProgress | None,
             poll: float) -> None:
    """Follow progress until every child exits, or until STOP_GRACE after the first essential
    child failed (the others then have had time to say why and end)."""
    tail = MetricsTail(run.metrics)
    failed_at: float | None = None
    while True:
        if progress is not None:
            for record in tail.read_new():
                progress.update(record)
        now = time.monotonic()
        for c in children:
            if c.exited_at is None and c.returncode is not None:
                c.exited_at = now
        if all(c.returncode is not None for c in children if c.essential):
            _wait_briefly([c for c in children if not c.essential and not c.serves],
                          timeout=STOP_GRACE)
            return
        if failed_at is None and any(c.essential and c.failed_on_its_own for c in children):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > STOP_GRACE:
            return
        time.sleep(poll)


def _wait_briefly(children: list[Child], timeout: float) -> None:
    """Let non-essential children (the sidecar) finish writing before they are stopped."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(c.returncode is None for c in children):
        time.sleep(0.05)


def _failure(children: list[Child], run: RunDir) -> RunFailed | None:
    """Name the process that failed first on its own, with its own last error line; add what
    the label party concluded (it names the party or component that broke the run). Input
    every role refuses (exit 2: a bad config or data file) is named by the label party's
    refusal: the roles start at once, so which of them refuses first is chance."""
    if all(c.returncode == 0 for c in children if c.essential):
        return None
    outcome = read_outcome(run)
    concluded = (f"{outcome['message']} [{outcome['code']}]" if outcome.get("status") == "failed"
                 else None)
    # A process a signal killed (one this orchestrator did not send) is the cause: the others
    # fail because it is gone, often within the same poll (an exit the zygote reports can come
    # a few milliseconds after the death that caused it).
    # A relay is not essential (its party's failure fails the run), but its death is the cause.
    failed = sorted((c for c in children if (c.essential or c.name.startswith(RELAY))
                     and c.failed_on_its_own),
                    key=lambda c: ((c.returncode or 0) >= 0, _told_by_a_party(c),
                                   c.exited_at or float("inf"), c is children[0]))
    killed = next((c for c in failed if (c.returncode or 0) < 0), None)
    named = next((c for c in children[1:] if concluded and c.name == outcome.get("culprit")), None)
    if concluded is not None and named is not None and not named.failed_on_its_own and killed is None:
        # e.g. a stalled party, stopped only at the end: the parties the label party then sent
        # away exited first, but it is the one that broke the run
        return RunFailed(concluded)
    if not failed:
        return RunFailed(concluded or "a party did not finish; see the logs in " + str(run.logs))
    label = children[0]
    first = killed or named or (label if label in failed and label.returncode == EXIT_BAD_INPUT
                                else failed[0])
    if first is label and concluded:  # the label party itself: its outcome says it best
        return RunFailed(concluded, first)
    reason = first.last_error()
    before = " before serving" if first is label and not run.label_party_address.exists() else ""
    message = f"{first.name} {first.how_it_ended()}{before}" + (f": {reason}" if reason else "")
    if concluded and concluded not in message:
        message += f"\nthe label party reports: {concluded}"
    return RunFailed(message, first)


def _told_by_a_party(child: Child) -> bool:
    """A sidecar that ended because a party it records said why it stopped: that party's
    failure, even when the sidecar exits first."""
    return child.name == "attacker sidecar" and child.returncode == EXIT_PARTY_STOPPED


def _record_failure(run: RunDir, failure: RunFailed) -> None:
    """The outcome says "failed", naming the process, when one failed before the label party
    could conclude (e.g. a passive party refused its data file before joining, and the label
    party was then stopped: not "interrupted", or nothing at all), and also when the label party
    finished ("ok") but a role it needs failed after (e.g. a sidecar that stalled once the last
    step was sent): that run's logs are incomplete, and `--resume` completes them from the last
    checkpoint."""
    outcome = read_outcome(run)
    status = outcome.get("status")
    if status == "failed" or (status != "ok" and failure.culprit is None):
        return
    party = (failure.culprit or "").removeprefix("passive party ")
    outcome.update(status="failed", code="UNAVAILABLE", message=str(failure),
                   culprit=failure.culprit, party=int(party) if party.isdigit() else None,
                   recorded_by="orchestrator")
    if status == "ok":
        outcome["trained"] = "the label party finished every step; a role failed after"
    outcome.update(newest_fields(run.root))  # where `--resume` goes on from, as the label party says
    try:
        write_outcome(run, outcome)
    except OSError:
        pass  # the run directory is unusable: the failure is printed all the same


def collect_outcome(run: RunDir, mode: str, seconds: float,
                    launched: float | None = None) -> RunOutcome:
    """Read the run's metrics into summary.json; `launched` (wall clock) is when its processes
    were started, so the summary says how long the first train step took to come."""
    final_eval = None
    steps, wall = 0, 0.0
    for record in read_metrics(run.metrics):
        if record["type"] == "eval":
            final_eval = record
        elif record["type"] == "train":
            steps, wall = record["step"] + 1, record["wall"]
    outcome = RunOutcome(run, mode, seconds, steps, final_eval, wall)
    write_training_summary(run, TrainingSummary.model_validate({
        "run_id": run.root.name, "mode": mode, "seconds": seconds, "train_steps": steps,
        "training_seconds": wall, "steps_per_second": outcome.steps_per_second,
        "final_eval": final_eval, **startup_summary(run, launched),
    }))
    return outcome


def startup_summary(run: RunDir, launched: float | None) -> dict[str, Any]:
    """When each role reached its start-up milestones, in seconds after the launch, and the
    device each computed on (from the roles' timing.json)."""
    if launched is None:
        return {}
    roles = {"label party": run.label_party, "attacker sidecar": run.attacker}
    roles |= {f"passive party {k}": run.passive_party(k)
              for k in sorted(int(p.name.rsplit("_", 1)[1]) for p in run.root.glob("passive_party_*"))}
    startup: dict[str, dict[str, float]] = {}
    devices: dict[str, str] = {}
    for name, folder in roles.items():
        timing = read_timing_file(timing_file(folder))
        marks = timing.get("startup") or {}
        if marks:
            startup[name] = {mark: at - launched for mark, at in marks.items()}
        if "device" in timing:
            devices[name] = timing["device"]
    first = startup.get("label party", {}).get("first_step")
    return {"launched_at": launched, "time_to_first_step_s": first, "startup_s": startup,
            "devices": devices}
