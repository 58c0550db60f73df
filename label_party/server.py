"""`label-party serve`: load labels, serve the session until the run ends, leave the outputs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from pathlib import Path
from typing import Any

import grpc
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from label_party.driver import drive
from label_party.outputs import clean_anchor_writer, write_outcome, write_outputs
from label_party.schedule import schedule
from label_party.servicer import LabelPartyServicer
from label_party.session import NetworkExchange, Session, SessionError
from label_party.setup import LabelPartyData, load_label_party_data, plan_record
from label_party.trainer import LabelPartyTrainer
from splitleak.config import ExperimentConfig
from splitleak.fileio import write_atomically
from splitleak.metrics_log import MetricsWriter
from splitleak.rundir import RunDir
from splitleak.tls import LABEL_PARTY
from splitleak.transport import bind, create_server
from splitleak.v1 import split_learning_pb2_grpc as pb_grpc

log = logging.getLogger("label_party")
SERVICE_NAME = "splitleak.v1.LabelParty"


async def serve(cfg: ExperimentConfig, run: RunDir, listen: str,
                port_file: Path | None = None, tls_dir: Path | None = None) -> int:
    """Serve one run; returns the process exit code (0: trained, 1: the run failed)."""
    torch.set_num_threads(cfg.run.torch_threads)
    data = load_label_party_data(cfg)
    session = Session(cfg, data, run.root.name)
    server = create_server(cfg.topology)
    pb_grpc.add_LabelPartyServicer_to_server(LabelPartyServicer(session), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = bind(server, listen, tls_dir, LABEL_PARTY)
    await server.start()
    serving = health_pb2.HealthCheckResponse.SERVING
    await health_servicer.set(SERVICE_NAME, serving)
    await health_servicer.set("", serving)
    host = listen.rsplit(":", 1)[0]
    log.info("label party listening on %s:%d (run %s)", host, port, run.root.name)
    if port_file is not None:
        write_atomically(port_file, lambda tmp: tmp.write_text(f"{host}:{port}\n"))
    writer = MetricsWriter(run.metrics)
    outcome = await _run(cfg, run, session, data, writer)
    writer.close()
    write_outcome(run, outcome)
    await health_servicer.enter_graceful_shutdown()
    await server.stop(grace=3.0)
    if outcome["status"] != "ok":
        log.error("run failed: %s", outcome["message"])
        return 1
    return 0


async def _run(cfg: ExperimentConfig, run: RunDir, session: Session, data: LabelPartyData,
               writer: MetricsWriter) -> dict[str, Any]:
    started = time.monotonic()
    executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="label-party-compute")
    loop = asyncio.get_running_loop()

    def compute(fn: Any, *args: Any) -> Any:
        return loop.run_in_executor(executor, fn, *args)

    writer.write(plan_record(data, len(session.party_ids), cfg.run.seed))
    exchange: NetworkExchange | None = None
    anchors = clean_anchor_writer(run, cfg, data.num_classes)
    try:
        await session.wait_for_parties()
        trainer = await compute(LabelPartyTrainer, cfg, data.labels, data.num_classes,
                                session.embedding_shapes(), data.own_inputs, data.train_ids,
                                anchors)
        exchange = NetworkExchange(session)
        batches = schedule(data.plan, data.train_ids, data.test_ids, cfg.run.seed)
        await drive(trainer, batches, exchange, writer.write, compute)
        await compute(write_outputs, run, trainer, data)
        await session.wait_closed(timeout=cfg.topology.step_deadline_s)
        return {"status": "ok", "seconds": time.monotonic() - started,
                "train_steps": data.plan.total_train_steps,
                "bytes_sent": exchange.bytes_sent, "bytes_received": exchange.bytes_received,
                "embedding_shapes": {k: list(v) for k, v in session.embedding_shapes().items()},
                "defenses": trainer.defense_summary(),
                "objective": trainer.objective_summary()}
    except SessionError as err:
        session.abort(err)
        await session.wait_closed(timeout=2.0)
        return {"status": "failed", "code": err.code.name, "party": err.party_id,
                "message": err.message, "seconds": time.monotonic() - started}
    except Exception as err:  # noqa: BLE001 - a bug here must still end every party's stream
        log.exception("label party failed")
        message = f"label party internal error: {type(err).__name__}: {err}"
        session.abort(SessionError(grpc.StatusCode.INTERNAL, message))
        await session.wait_closed(timeout=2.0)
        return {"status": "failed", "code": "INTERNAL", "party": None, "message": message,
                "seconds": time.monotonic() - started}
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        if anchors is not None:
            anchors.close()
