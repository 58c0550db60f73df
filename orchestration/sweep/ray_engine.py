"""The Ray engine: every point is a placement group with one bundle per role (label party,
attacker sidecar, each passive party); PACK by default, STRICT_SPREAD (`--spread`) puts every
role of a point on a different node. Role actors run the same per-service coroutines as the
role CLIs (orchestration.sweep.roles), reach each other by node IP over mutual TLS with
identities the driver makes per run for the nodes involved, and either write into a shared
output directory or stream their files back to the driver. The point's analysis then runs on
the driver, as the local engine's worker runs it.

The only module that imports Ray (the optional extra `splitleak[ray]`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import ray
from ray._private import ray_constants
from ray._private import worker as ray_worker
from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
from ray.exceptions import RayActorError
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from orchestration.launch import LABEL_PARTY, Role, start_order, topology_of
from orchestration.launch import roles as launch_roles
from orchestration.processes import spawn, stop_all
from orchestration.run import STOP_GRACE, collect_outcome
from orchestration.sweep.engine import (
    POINT_LOG,
    Engine,
    EngineError,
    Listener,
    PointResult,
    ResumeRefused,
    log_line,
    read_result,
    refused_result,
    resume_run_dir,
    write_result,
)
from orchestration.sweep.points import Point
from orchestration.sweep.ray_failures import (
    CONNECT_TIMEOUT_S,
    CONNECT_TRIES,
    died,
    no_cluster,
    not_a_gcs,
    refused,
    unreachable,
)
from orchestration.sweep.roles import RoleHost, receive
from orchestration.sweep.scratch import SWEEP_FOLDER, remove_scratch
from splitleak import tls
from splitleak.artifacts.outcome import read_outcome
from splitleak.artifacts.paths import RunDir
from splitleak.placement import CORES_ENV, cores
from splitleak.stopping import StopNoted, Terminated, stopped_by, stops_noted

# A point that fits the cluster waits at most this long for other jobs to free its CPUs.
PLACEMENT_TIMEOUT_S = 600.0
# Ray's own lines on the driver ('Started a local Ray instance.', its token warning): in the
# sweep directory, not on the terminal
RAY_LOG = "ray_driver.log"
# Why a point whose roles stream their files back cannot resume: each role starts on a fresh
# node-local directory, and a stopped point's files never came back.
STREAMED = "its roles stream their files back (resume needs --shared-dir)"


@ray.remote(max_restarts=0)
class RoleActor:
    """One role of one point on the node Ray placed its bundle on."""

    def __init__(self, role: str, config_toml: str, run_name: str, run_root: str | None,
                 identity: dict[str, bytes] | None, cpus: float, resume: bool, sweep: str) -> None:
        self.host = RoleHost(role, config_toml, run_name, run_root, identity, cpus, resume, sweep)
        self.host.capture_output()  # this worker process is the role's alone

    def where(self) -> dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(),
                "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

    def start(self, label_party: str | None = None, attacker: str | None = None,
              loopback: bool = False) -> str | None:
        host = "127.0.0.1" if loopback else ray.util.get_node_ip_address()
        return self.host.start(host, label_party, attacker)

    def poll(self) -> dict[str, Any]:
        return self.host.poll()

    def files(self):  # noqa: ANN201 - a Ray streaming generator
        yield from self.host.files()

    def cleanup(self) -> None:
        self.host.cleanup()


# On the node the task is put on: a point's node-local files, whatever its roles' end (a function
# of a module that imports nothing heavy: the task's worker imports it alone)
_remove_scratch = ray.remote(num_cpus=0, max_retries=0)(remove_scratch)


class _Cancelled(Exception):
    pass


class _Cancel(threading.Event):
    """Set when the sweep is stopped; `why` says by what (as the points' results say it)."""

    why = "stopped by Ctrl-C"


class _Phases:
    """Wall seconds of a point's phases on Ray (what ray.json reports as its overhead)."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self.seconds: dict[str, float] = {}

    def mark(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[phase] = round(now - self._last, 3)
        self._last = now


def private_auth_token() -> None:
    """Ray starts a local cluster with token authentication and writes the token to
    ~/.ray/auth_token with the umask's mode (0644 seen): make it 0600 from creation (Ray reads
    an existing one), or tighten one an earlier cluster left readable.

    (A local cluster cannot be bound to loopback: Ray 2.60's GCS, raylet and workers listen on
    every interface whatever `_node_ip_address` says, so the token is what keeps others out;
    this engine's own role services do listen on 127.0.0.1 on a local cluster.)"""
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        return
    token = Path.home() / ".ray" / "auth_token"
    token.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        if token.stat().st_mode & 0o077:
            token.chmod(0o600)
        return
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))  # what Ray itself writes: 256 random bits in hex


def _init(address: str | None, given: str = "--address") -> None:
    """ray.init; at an address, EngineError naming it within about 20 s where no
    cluster answers or the one there refuses this driver (Ray alone retries for minutes);
    `given`: where the address came from (--address, or RAY_ADDRESS), as messages name it."""
    if address is None:
        with _sigterm_kept():
            ray.init(log_to_driver=False)
        return
    if (why := unreachable(address)) is not None:
        raise EngineError(no_cluster(address, why, given))
    if (why := _not_a_gcs(address)) is not None:
        raise EngineError(not_a_gcs(address, why, given))
    tries = "RAY_gcs_server_port_wait_time_s"  # read by ray.init itself, not at import
    saved = os.environ.get(tries)
    os.environ.setdefault(tries, str(CONNECT_TRIES))
    try:
        with _sigterm_kept():
            ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ray.exceptions.RayError) as err:
        raise EngineError(refused(address, err, given)) from None
    finally:
        if saved is None:
            os.environ.pop(tries, None)


@contextmanager
def _sigterm_kept() -> Iterator[None]:
    """Around ray.init, which puts in a SIGTERM handler of its own for good: it exits with code
    15 and not a word, where the sweep's says 'stopped by SIGTERM' and exits 143 with its index
    saying so. The sweep's handler is put back, and a SIGTERM Ray's met meanwhile is the sweep's
    Terminated."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    except SystemExit as stop:
        if stop.code != signal.SIGTERM:
            raise
        raise Terminated from None
    finally:
        if previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)


@contextmanager
def _ray_lines_kept(path: Path) -> Iterator[None]:
    """Ray's own log lines on the driver (its "ray" logger: 'Started a local Ray instance.',
    'Token authentication is enabled ...', 'Connecting to existing Ray cluster ...') go to
    `path` rather than the terminal, where they came before the sweep's own lines; its errors
    reach the terminal too (a failure itself is the engine's one sentence)."""
    ray_logger = logging.getLogger("ray")
    kept = logging.FileHandler(path, delay=True)
    kept.setFormatter(logging.Formatter(ray_constants.LOGGER_FORMAT))
    terminal = {handler: handler.level for handler in ray_logger.handlers}
    for handler in terminal:
        handler.setLevel(max(handler.level, logging.ERROR))
    ray_logger.addHandler(kept)
    try:
        yield
    finally:
        ray_logger.removeHandler(kept)
        kept.close()
        for handler, level in terminal.items():
            handler.setLevel(level)


def _quiet_raylet_messages() -> None:
    """Ray's driver prints every error published to its job (its listener labels them all
    'raylet') to this process's stdout, whatever log_to_driver says: a node lost mid-sweep put
    'Raylet is terminated ...' with ~20 lines of the raylet's state dump, twice, and 'The node
    ... has been marked dead' ahead of the point's own sentence, which names the role, its node
    and Ray's reason. Those two messages stay in Ray's log files on their node (logs/raylet.out
    of its session); every other message the driver prints passes on. Where this Ray has no
    print_to_stdstream to wrap, nothing changes; _restore_ray_printing undoes it."""
    printing = getattr(ray_worker, "print_to_stdstream", None)
    if printing is not None and printing is not _quiet_raylet:
        _RAY_PRINTING[:] = [printing]
        ray_worker.print_to_stdstream = _quiet_raylet


def _restore_ray_printing() -> None:
    """Ray's own print_to_stdstream back, once this engine's run is over."""
    if _RAY_PRINTING and getattr(ray_worker, "print_to_stdstream", None) is _quiet_raylet:
        ray_worker.print_to_stdstream = _RAY_PRINTING.pop()


_RAY_PRINTING: list[Any] = []  # Ray's own print_to_stdstream, while replaced
LOST_NODE = ("Raylet is terminated", "has been marked dead")  # what a lost node publishes


def _quiet_raylet(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
    """Ray's print_to_stdstream (whatever its version's arguments), a lost node's messages left out."""
    lines = data.get("lines") or []
    if data.get("pid") == "raylet" and any(m in str(line) for line in lines for m in LOST_NODE):
        return
    _RAY_PRINTING[0](data, *args, **kwargs)


def _not_a_gcs(address: str) -> str | None:
    """Why what listens at HOST:PORT is no Ray GCS, in one gRPC call of at most
    CONNECT_TIMEOUT_S (None: it answers as one, or refuses this driver, as ray.init then says).
    Without it ray.init printed Ray's own C++ warnings of a GCS that never answers."""
    if address == "auto" or "://" in address or os.environ.get("RAY_USE_TLS", "0") not in ("", "0"):
        return None  # Ray Client, found on this machine, or a GCS over TLS: ray.init's to reach
    # as Ray's own gRPC, never through an http_proxy the environment names
    with grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(),  # type: ignore[attr-defined]
                timeout=CONNECT_TIMEOUT_S)
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                              grpc.StatusCode.UNIMPLEMENTED):
                return f"{err.code().name}: {err.details()}"
    return None


def _names(point: Point) -> dict[str, str]:
    """Each role's key (passive_party_1) and how messages name it (passive party 1)."""
    return {role.key: role.name for role in _plan(point)}


def _reason(point: Point, err: Exception, actors: dict[str, Any], nodes: dict[str, Any]) -> str:
    """Why a point failed: the role whose actor died, named, or the role's own error."""
    if isinstance(err, RayActorError):
        for role, actor in actors.items():
            if err.actor_id in (actor._actor_id.hex(), actor._actor_id.binary()):
                return died(_names(point)[role], nodes.get(role), str(err))
    cause = getattr(err, "cause", None) or err  # a role's own error, not Ray's wrapper
    return f"{type(cause).__name__}: {cause}"


def _plan(point: Point) -> list[Role]:
    """The point's launch plan in start order (the Ray engine runs no relays: check_network)."""
    return start_order(launch_roles(topology_of(point.config)))


def _roles(point: Point) -> list[str]:
    return [role.key for role in _plan(point)]


class RayEngine(Engine):
    name = "ray"

    def __init__(self, address: str | None = None, spread: bool = False, shared_dir: Path | None = None,
                 jobs: int | None = None, cpus_per_role: float = 1.0, poll: float = 0.5) -> None:
        self.address = address
        self.spread = spread
        self.shared_dir = shared_dir
        self.cpus_per_role = cpus_per_role
        self.poll = poll
        self._jobs = jobs
        self.jobs = jobs or 1  # known once connected: what the cluster's CPUs hold
        self.connected = False
        # this run's folder in each node's temporary directory, the points' node-local files in it
        self.sweep = f"{SWEEP_FOLDER}{secrets.token_hex(6)}"
        self.local = False  # this engine started a cluster on this machine alone (see _connect)

    def _connect(self, points: Sequence[Point]) -> None:
        _quiet_raylet_messages()
        if not ray.is_initialized():
            # No address and none in RAY_ADDRESS: ray.init starts a cluster on this machine
            # alone, whose roles then listen on loopback only.
            self.local = self.address is None and not os.environ.get("RAY_ADDRESS")
            if self.local:
                private_auth_token()
            _init(self.address or os.environ.get("RAY_ADDRESS"),
                  "--address" if self.address else "RAY_ADDRESS")
        nodes = [n for n in ray.nodes() if n["Alive"]]
        usable = [n for n in nodes if n["Resources"].get("CPU", 0) >= self.cpus_per_role]
        widest = max(len(_roles(p)) for p in points)
        if self.spread and widest > len(usable):
            raise EngineError(f"--spread puts each of a point's {widest} roles on its own node, but "
                              f"the cluster has {len(usable)} node(s) with at least "
                              f"{self.cpus_per_role:g} CPU; add nodes or drop --spread")
        cpus = sum(n["Resources"].get("CPU", 0) for n in nodes)
        self.jobs = self._jobs or max(1, int(cpus // (self.cpus_per_role * widest)))
        self.connected = True

    def at_a_time(self) -> str:
        if self._jobs is None and not self.connected:
            return "as many at a time as the cluster's CPUs hold"
        return super().at_a_time()

    def run(self, points: Sequence[Point], listener: Listener) -> dict[str, PointResult]:
        if not points:
            return {}
        started_ray = not ray.is_initialized()
        with _ray_lines_kept(points[0].run_dir.parent / RAY_LOG):
            try:
                self._connect(points)
                with stops_noted() as stop:  # Ray's weakref callbacks would swallow a KeyboardInterrupt
                    return self._run_points(points, listener, stop)
            finally:
                if started_ray and ray.is_initialized():  # its cluster, if it started one, goes too
                    ray.shutdown()
                _restore_ray_printing()

    def _run_points(self, points: Sequence[Point], listener: Listener,
                    stop: StopNoted) -> dict[str, PointResult]:
        """Up to `jobs` points at a time, each in a thread of its own; on a noted Ctrl-C or
        SIGTERM the running points stop their actors and report, queued ones never start."""
        cancel = _Cancel()
        results: dict[str, PointResult] = {}
        with ThreadPoolExecutor(self.jobs, thread_name_prefix="ray-point") as pool:
            futures = {pool.submit(self._run_point, p, listener, cancel): p for p in points}
            pending = set(futures)
            while pending and stop.signum is None:
                done, pending = wait(pending, timeout=self.poll, return_when=FIRST_COMPLETED)
                for future in done:
                    if (result := future.result()) is not None:
                        results[futures[future].hash] = result
            if stop.signum is None:
                return results
            cancel.why = stopped_by(stop.error())
            cancel.set()
            pool.shutdown(wait=True, cancel_futures=True)
            for future in pending:
                if not future.cancelled() and (result := future.result()) is not None:
                    results[futures[future].hash] = result
        raise stop.error()

    def _run_point(self, point: Point, listener: Listener, cancel: _Cancel) -> PointResult | None:
        if cancel.is_set():
            return None
        listener.started(point)
        started = time.monotonic()
        try:  # the label party checks the data files where it runs: not on this node
            run, flags, note = resume_run_dir(point, None if self.shared_dir is not None else STREAMED,
                                              data_here=False)
        except ResumeRefused as err:  # fails, its checkpoints kept
            result = refused_result(point, err, time.monotonic() - started)
            listener.finished(point, result)
            return result
        if note is not None:
            log_line(run.logs / POINT_LOG, note)
        if "--analysis-only" in flags:  # trained by an earlier attempt
            result = self._analyse(point, run, started, None, cancel)
            write_result(run.root, result)
            listener.finished(point, result)
            return result
        roles = _roles(point)
        strategy = "STRICT_SPREAD" if self.spread else "PACK"
        unplaceable = self._unplaceable(len(roles))
        if unplaceable is not None:
            result = PointResult("failed", time.monotonic() - started, unplaceable)
            write_result(run.root, result)
            listener.finished(point, result)
            return result
        group = placement_group([{"CPU": self.cpus_per_role}] * len(roles), strategy=strategy)
        actors: dict[str, Any] = {}
        nodes: dict[str, Any] = {}
        status: dict[str, dict[str, Any]] = {}
        essential: list[str] = []
        message: str | None = None
        phases = _Phases()
        launched: float | None = None  # wall clock: when the roles' actors were asked for
        try:
            try:
                self._wait(group.ready(), cancel, PLACEMENT_TIMEOUT_S,
                           f"the cluster did not free {len(roles)} x {self.cpus_per_role:g} CPU for "
                           f"this point's roles within {PLACEMENT_TIMEOUT_S:g} s (other jobs hold them?)")
                phases.mark("placement")
                launched = time.time()  # as the local engine's launch: the start-up is after it
                actors = self._place(point, run, roles, group, "--resume" in flags)
                nodes = {role: ray.get(actor.where.remote()) for role, actor in actors.items()}
                phases.mark("actors")
                status, essential = self._train(point, actors, nodes, listener, cancel)
                phases.mark("training")
            except _Cancelled:
                raise
            except Exception as err:  # noqa: BLE001 - the point fails, the sweep goes on
                message = _reason(point, err, actors, nodes)
            self._collect(run, actors)  # a failed point keeps what its surviving roles wrote
            phases.mark("streaming")
            message = message or self._failure(run, status, essential)
        except _Cancelled:
            result = PointResult("interrupted", time.monotonic() - started, cancel.why,
                                 nodes or None)
            write_result(run.root, result)
            listener.finished(point, result)
            return result
        except Exception as err:  # noqa: BLE001 - streaming failed: the point fails
            message = message or _reason(point, err, actors, nodes)
        finally:
            self._release(actors, group, run.root.name)
        placed = nodes or None
        if message is None:
            # the roles' timing.json came back with their files: their start-up marks and
            # devices (a multi-node cluster's marks are on each node's clock)
            collect_outcome(run, "ray", time.monotonic() - started, launched)
            result = self._analyse(point, run, started, placed, cancel)
            phases.mark("analysis")
        else:
            result = PointResult("failed", time.monotonic() - started, message, placed)
        run.ray.write_text(json.dumps(
            {"strategy": strategy, "nodes": placed, "seconds": phases.seconds}, indent=2))
        write_result(run.root, result)  # the whole point's, over the analysis worker's own
        listener.finished(point, result)
        return result

    def _unplaceable(self, roles: int) -> str | None:
        """Why a point of `roles` roles can never be placed on this cluster (None: it can)."""
        nodes = [n for n in ray.nodes() if n["Alive"]]
        bundles = sum(int(n["Resources"].get("CPU", 0) // self.cpus_per_role) for n in nodes)
        if bundles >= roles:
            return None
        cpus = sum(n["Resources"].get("CPU", 0) for n in nodes)
        return (f"the point needs {roles} roles x {self.cpus_per_role:g} CPU, but the cluster's "
                f"{len(nodes)} node(s) ({cpus:g} CPU in all) hold only {bundles} such role(s): add "
                "nodes or CPUs, or give each role fewer CPUs with --cpus-per-role")

    def _wait(self, ref: Any, cancel: _Cancel, timeout: float,
              what: str | None = None) -> Any:
        end = time.monotonic() + timeout
        while True:
            ready, _ = ray.wait([ref], timeout=self.poll)
            if ready:
                return ray.get(ready[0])
            if cancel.is_set():
                raise _Cancelled
            if time.monotonic() > end:
                raise TimeoutError(what or f"no answer from the cluster within {timeout:g} s")

    def _place(self, point: Point, run: RunDir, roles: list[str], group: PlacementGroup,
               resume: bool) -> dict[str, Any]:
        """One actor per role on its bundle, with a TLS identity valid for its node's address."""
        table = placement_group_table(group)["bundles_to_node_id"]
        addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        identities: dict[str, dict[str, bytes]] = {}
        if point.config.topology.tls:
            tls_dir = run.root / "tls"
            tls.generate(tls_dir, tls.identities(point.config.topology.passive_parties),
                         hosts=sorted({addresses[node] for node in table.values()}))
            for role in roles:
                name = role.replace("_", "-")  # Role.service: its TLS identity
                identities[role] = {f: (tls_dir / f).read_bytes()
                                    for f in ("ca.pem", f"{name}.pem", f"{name}.key")}
            tls.remove_private_keys(tls_dir)  # they travel to the actors in memory only
        config = point.config.to_toml()
        shared = str(run.root.resolve()) if self.shared_dir is not None else None
        return {role: RoleActor.options(  # type: ignore[attr-defined]  # ray.remote made it an ActorClass
            num_cpus=self.cpus_per_role, scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=i)).remote(
            role, config, run.root.name, shared, identities.get(role), self.cpus_per_role, resume,
            self.sweep)
            for i, role in enumerate(roles)}

    def _train(self, point: Point, actors: dict[str, Any], nodes: dict[str, Any], listener: Listener,
               cancel: _Cancel) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """Start the servers, then the passive parties; follow until every essential role ended
        (a role whose actor died has ended, its status saying so in `died`). Returns each role's
        last status and the roles whose failure fails the run."""
        cfg = point.config
        deadline = cfg.topology.join_deadline_s + 30.0
        plan = _plan(point)
        pending: dict[str, Any] = {}  # role -> its start(): a server answers with its address
        addresses: dict[str, str | None] = {}

        def address(key: str | None) -> str | None:
            if key is not None and key not in addresses:
                addresses[key] = self._wait(pending[key], cancel, deadline)
            return addresses.get(key) if key is not None else None

        for role in plan:  # each once the roles it reaches serve; servers load at once
            pending[role.key] = actors[role.key].start.remote(
                address(role.reaches), address(role.taps), self.local)
        for key in pending:
            address(key)
        essential = [role.key for role in plan if role.essential]
        grace = cfg.topology.step_deadline_s + 10.0
        failed_at: float | None = None
        status: dict[str, dict[str, Any]] = {}
        while True:
            if cancel.is_set():
                raise _Cancelled
            polls = {role: actor.poll.remote() for role, actor in actors.items()
                     if not status.get(role, {}).get("died")}
            for key, poll in polls.items():
                try:
                    status[key] = ray.get(poll, timeout=60)
                except RayActorError as err:
                    message = died(_names(point)[key], nodes.get(key), str(err))
                    status[key] = {"done": True, "code": 1, "error": message, "died": message,
                                    "records": []}
            for record in status[LABEL_PARTY]["records"]:
                listener.record(point, record)
            ended = [r for r in essential if status[r]["done"]]
            if len(ended) == len(essential) and all(s["done"] for s in status.values()):
                break
            if failed_at is None and any(status[r]["code"] for r in ended):
                failed_at = time.monotonic()
            if len(ended) == len(essential) and failed_at is None:
                failed_at = time.monotonic()  # give a non-essential sidecar its grace period
            # A dead role never answers: the others get the local engine's few seconds to say
            # why (a label party waiting for it to join would wait out its deadline).
            lost = any(s.get("died") for s in status.values())
            if failed_at is not None and time.monotonic() - failed_at > (STOP_GRACE if lost else grace):
                break
            time.sleep(self.poll)
        return status, essential

    def _collect(self, run: RunDir, actors: dict[str, Any]) -> None:
        """Stream every living role's files into the driver's run directory (not with a shared
        one); a dead actor's files died with it."""
        if self.shared_dir is not None:
            return
        earlier = {p: p.read_bytes() for p in run.logs.glob("*.log") if p.name != POINT_LOG}
        for actor in actors.values():
            try:
                receive(run.root, (ray.get(ref) for ref in actor.files.options(
                    num_returns="streaming").remote()))
            except RayActorError:
                continue
        for path, before in earlier.items():  # an earlier attempt's logs go before this one's
            path.write_bytes(before + (path.read_bytes() if path.is_file() else b""))

    @staticmethod
    def _failure(run: RunDir, status: dict[str, dict[str, Any]], essential: list[str]) -> str | None:
        """None when training succeeded, else the reason, naming the party (a dead actor first,
        then outcome.json)."""
        if all(status[r]["code"] == 0 for r in essential):
            return None
        if lost := [status[r]["died"] for r in essential if status[r].get("died")]:
            return lost[0]
        outcome = read_outcome(run)
        if outcome.get("status") == "failed":
            return f"{outcome['message']} [{outcome['code']}]"
        for role in essential:
            if status[role]["code"] != 0:
                return status[role]["error"] or f"{role} did not finish"
        return "a role did not finish"

    def _release(self, actors: dict[str, Any], group: PlacementGroup, run_name: str) -> None:
        """Each living actor removes its node-local scratch, then every actor is killed and a
        task on each node of the group removes the point's scratch there, a dead actor's too
        (10 s at most for each: a stopped sweep waits no longer; a lost node's stays on it),
        and the group is removed."""
        if cleaned := [actor.cleanup.remote() for actor in actors.values()]:
            ray.wait(cleaned, num_returns=len(cleaned), timeout=10)  # a dead actor's: at once
        for actor in actors.values():
            ray.kill(actor)
        nodes = set(placement_group_table(group).get("bundles_to_node_id", {}).values())
        removed = [_remove_scratch.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                self.sweep, run_name) for node in nodes] if actors else []
        if removed:
            ray.wait(removed, num_returns=len(removed), timeout=10)
        remove_placement_group(group)

    def _analyse(self, point: Point, run: RunDir, started: float, nodes: dict[str, Any] | None,
                 cancel: _Cancel) -> PointResult:
        """The attacker's analysis on the driver, in a worker process like the local engine's,
        with its share of the driver's cores (up to `jobs` points analyse at once)."""
        child = spawn(f"analysis of {point.label}",
                      ["orchestration.sweep.worker", str(run.root), "--analysis-only"],
                      run.logs / POINT_LOG, env={CORES_ENV: str(max(1, cores() // self.jobs))})
        while child.returncode is None:
            if cancel.is_set():
                stop_all([child])
                return PointResult("interrupted", time.monotonic() - started, cancel.why, nodes)
            time.sleep(self.poll)
        result = read_result(run.root)
        if result is None:
            return PointResult("failed", time.monotonic() - started,
                               f"analysis exited with code {child.returncode}: {child.log_tail(5)}", nodes)
        return PointResult(result.status, time.monotonic() - started, result.message, nodes)
