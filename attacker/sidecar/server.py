"""`attacker serve`: the sidecar process: serve Record until every observed party is done."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from pathlib import Path

from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from attacker.sidecar.servicer import LABEL, PASSIVE, AttackerServicer, Key, add_sidecar, who
from attacker.sidecar.store import INDEX, GradientStore
from splitleak.addresses import check_address, check_address_file
from splitleak.artifacts.paths import RunDir
from splitleak.cli_common import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_PARTY_STOPPED
from splitleak.config import ExperimentConfig, TopologyConfig
from splitleak.fileio import write_atomically
from splitleak.heap import freeze_start_up
from splitleak.timing import mark_startup, write_cpu
from splitleak.tls import ATTACKER
from splitleak.transport import ListenError, bind, create_server

log = logging.getLogger("attacker")
SERVICE_NAME = "splitleak.v1.AttackerSidecar"
# Once every expected stream has ended, one or more broken (their party failed or was stopped),
# how long a party may take to open its stream again before the sidecar ends (exit 1). A party
# resumed by hand starts later than this: it reaches a sidecar started again with --resume. No
# wait when the party of every stream that ended unfinished failed (it did not stop on its host).
BROKEN_GRACE_S = 5.0


def record_shapes(cfg: ExperimentConfig) -> dict[Key, dict[str, tuple[int, ...]]]:
    """(observer, party) -> the per-row shape of each tensor its records carry, as the shared
    config gives the party's bottom model: no record, not even the first, can set another."""
    from splitleak.datasets import build_dataset
    from splitleak.partition import passive_columns
    from splitleak.validation import bottom_shapes

    schema = build_dataset(cfg.dataset.name, cfg.dataset.params).layout()
    shapes: dict[Key, dict[str, tuple[int, ...]]] = {}
    for k, columns in passive_columns(cfg, schema).items():
        activation, first = bottom_shapes(cfg, schema, columns)
        shapes[(PASSIVE, k)] = {"cut_gradient": activation, "activation": activation,
                                "first_layer_gradient": first}
        shapes[(LABEL, k)] = {"activation": activation}
    return shapes


async def serve(out: Path, listen: str, observe: set[int], run_id: str,
                topology: TopologyConfig, port_file: Path | None = None,
                tls_dir: Path | None = None, resume: bool = False,
                receive: set[int] | None = None,
                shapes: dict[Key, dict[str, tuple[int, ...]]] | None = None,
                config_hash: str | None = None) -> int:
    """Record until every observed party (and, for `receive`, the label party's tap of what
    it receives from those parties) is done; `resume` continues the logs already in `out`
    (each tap cuts its log back to the resumed step first); `shapes` (record_shapes) fixes
    every record's shape from the config (without it, each party's first record does);
    `config_hash` (the config's) is what every stream's records must name. Returns the exit
    code: 0 every observed party closed its stream, 1 one did not (it never opened one, or its
    stream broke, was refused or was stopped by its party and was not opened again within
    BROKEN_GRACE_S; at once if its party said it failed), 130 stopped by a signal."""
    gradients = RunDir(out).gradients
    store = GradientStore(gradients, run_id, resume=resume)
    received = (GradientStore(RunDir(out).received, run_id, resume=resume)
                if receive else None)
    servicer = AttackerServicer(store, observe, run_id or None, tls=tls_dir is not None,
                                received=received, receive=receive, shapes=shapes,
                                config_hash=config_hash, max_message_mb=topology.max_message_mb)
    server = create_server(topology)
    add_sidecar(server, servicer, topology.max_message_mb)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        port = bind(server, listen, tls_dir, ATTACKER)
    except ListenError as err:
        raise ServeError(str(err)) from None
    await server.start()
    mark_startup("serving")
    freeze_start_up()  # its imports out of the collections while it records
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    host = listen.rsplit(":", 1)[0]
    log.info("attacker sidecar listening on %s:%d, observing parties %s%s", host, port,
             sorted(observe), f", the label party receiving from {sorted(receive)}" if receive else "")
    if port_file is not None:
        write_atomically(port_file, lambda tmp: tmp.write_text(f"{host}:{port}\n"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if threading.current_thread() is threading.main_thread():
        # Signals reach only the main thread; a sidecar run in a worker thread (a Ray role
        # actor) is stopped by ending its process instead.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    done = asyncio.ensure_future(servicer.all_finished.wait())
    stopped = asyncio.ensure_future(stop.wait())
    abandoned = asyncio.ensure_future(_never_joined(servicer, 2 * topology.join_deadline_s))
    broken_off = asyncio.ensure_future(_broken_off(servicer, BROKEN_GRACE_S))
    await asyncio.wait([done, stopped, abandoned, broken_off], return_when=asyncio.FIRST_COMPLETED)
    for watcher in (abandoned, broken_off):
        watcher.cancel()
    await health_servicer.enter_graceful_shutdown()
    await server.stop(grace=2.0)
    servicer.refusals.flush()
    for each in servicer.stores.values():
        each.close()
    # Its CPU per train step, for `splitleak bench`'s budget (the first mark is a record's
    # arrival, so per step = (marks - 1) intervals of one stream).
    write_cpu(RunDir(out).attacker_timing, servicer.cpu,
              max(servicer.timed_steps.values(), default=1) - 1)
    missing = sorted(servicer.expected - servicer.finished)
    unfinished = _unfinished(servicer, missing)
    if stopped.done():  # even when every stream ended meanwhile: a stop ended the parties too
        log.warning("interrupted by a signal%s: the log at %s holds what was recorded until then "
                    "(attacker serve --resume continues it)", unfinished, gradients)
    elif missing:
        log.error("stopped%s", unfinished)
    else:  # a closed stream says nothing of whether its party finished the run: say what is held
        log.info("every observed party closed its stream (%s); log at %s",
                 "; ".join(_held(servicer, key) for key in sorted(servicer.expected)), gradients)
    if stopped.done():  # a stop is no finished run, whatever streams had ended by then
        return EXIT_INTERRUPTED
    if any(key in servicer.stopped for key in missing):  # a party stopped and said why
        return EXIT_PARTY_STOPPED
    return EXIT_FAILED if missing else 0


class ServeError(ValueError):
    """The sidecar cannot serve as asked (its address, its port file, the log to resume)."""


def check_arguments(out: Path, listen: str, port_file: Path | None, resume: bool) -> None:
    """ServeError (exit 2) naming what is wrong when the sidecar could not serve as asked."""
    try:
        check_address(listen, "--listen")
        check_address_file(port_file, "--port-file")
    except ValueError as err:
        raise ServeError(str(err)) from None
    if resume:
        check_resumable(RunDir(out))


def check_resumable(run: RunDir) -> None:
    """ServeError unless `run` is a run directory or holds a gradient log to continue."""
    logs = [run.gradients / INDEX, run.received / INDEX]
    if not run.config.is_file() and not any(i.exists() for i in logs):
        raise ServeError(f"--resume {run.root} is not a run directory (it has neither "
                         f"{run.config.name} nor a gradient log to continue)")


def _held(servicer: AttackerServicer, key: Key) -> str:
    store, party = servicer.stores[key[0]], key[1]
    records, _ = store.counts(party)
    last = store.last_step(party)
    return f"{who(key)}: {records} record(s)" + (f" up to step {last}" if last is not None else "")


def _unfinished(servicer: AttackerServicer, missing: list[Key]) -> str:
    """' before <the streams> finished streaming', and how each one that ended unclosed ended."""
    if not missing:
        return ""
    broken = "; ".join(f"{who(key)} stopped: {servicer.stopped[key]}" if key in servicer.stopped
                       else f"the Record stream of {who(key)} {servicer.broken[key]}"
                       for key in missing if key in servicer.broken)
    return f" before {', '.join(map(who, missing))} finished streaming" + (
        f": {broken}" if broken else "")


async def _broken_off(servicer: AttackerServicer, grace: float) -> None:
    """Return once every expected stream has ended, one or more broken, refused or stopped, and
    none was opened again for `grace` s: the run it recorded has failed, and a sidecar must not
    outlive it (a party opening its stream again within the grace goes on being recorded). No
    grace when the party of each such stream said it failed (not stopped on its host)."""
    loop = asyncio.get_running_loop()
    while True:
        await servicer.all_ended.wait()
        wait = 0.0 if servicer.broken.keys() <= servicer.gone else grace
        quiet = loop.time() - servicer.ended_at
        if quiet >= wait:
            return
        await asyncio.sleep(wait - quiet)


async def _never_joined(servicer: AttackerServicer, deadline: float) -> None:
    """Give up when an expected tap has not opened its Record stream in time (its run never
    started): a sidecar must not outlive the run it was started for."""
    await asyncio.sleep(deadline)
    came = servicer.streaming | servicer.finished | servicer.broken.keys()
    silent: list[Key] = sorted(servicer.expected - came)
    if not silent:
        await asyncio.Event().wait()  # everyone came: their streams decide when we end
    for key in silent:
        if key in servicer.refused:
            log.error("%s was refused: %s; giving up", who(key), servicer.refused[key])
        else:
            log.error("%s never opened a Record stream within %g s; giving up", who(key), deadline)
