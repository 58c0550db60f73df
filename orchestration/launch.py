"""The launch plan of a run: which roles start, with which arguments, identities and taps.

Every role of a local run starts at once: a role that must reach another names that role's
address file (`@FILE`, splitleak.addresses) and reads it only when it connects, so the
imports, data loading and model building of all of them overlap."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestration.relay import link_seed
from splitleak.config import ExperimentConfig
from splitleak.rundir import RunDir

LABEL_PARTY, SIDECAR = "label party", "attacker sidecar"


@dataclass(frozen=True)
class RoleLaunch:
    """One process of the run: `python -m <args>`, its output in logs/<log>."""

    name: str
    args: tuple[str, ...]
    log: str
    essential: bool = True  # its failure fails the run
    serves: bool = False  # serves until the run stops it (never waited for)


def passive_name(k: int) -> str:
    return f"passive party {k}"


def launch_plan(cfg: ExperimentConfig, run: RunDir, resume: bool = False,
                routed: bool = False) -> list[RoleLaunch]:
    """The label party first (a Ctrl-C reaches it first), then the sidecar, each passive party
    and, with [network], each party's shaping relay. `routed`: the parties reach the label
    party at the address the orchestrator writes to `run.routed_address` (the bench's relay)."""
    where = ("--resume", str(run.root)) if resume else None
    tls = ("--tls-dir", str(run.tls)) if cfg.topology.tls else ()
    sidecar = f"@{run.attacker_address}" if cfg.sidecar_needed else None
    label_taps = ("--attacker", sidecar) if sidecar and cfg.received_parties else ()
    roles = [RoleLaunch(LABEL_PARTY, (
        "label_party", "serve", "--config", str(run.config),
        *(where or ("--run-dir", str(run.root))), "--port-file", str(run.label_party_address),
        "--listen", cfg.topology.label_party_address, *tls, *label_taps), "label_party.log")]
    if sidecar:
        roles.append(RoleLaunch(SIDECAR, (
            "attacker", "serve", "--listen", "127.0.0.1:0", *(where or ("--out", str(run.root))),
            "--config", str(run.config), "--run-id", run.root.name,
            "--port-file", str(run.attacker_address), *tls), "attacker.log",
            essential=cfg.attacker.on_sidecar_failure == "fail"))
    label = run.routed_address if routed else run.label_party_address
    for k in range(1, cfg.topology.passive_parties + 1):
        link = f"@{label}"
        if cfg.network.shaped:
            roles.append(_relay(cfg, run, k, link))
            link = f"@{run.relay_address(k)}"
        tap = ("--attacker", sidecar) if sidecar and k in cfg.tapped_parties else ()
        roles.append(RoleLaunch(passive_name(k), (
            "passive_party", "run", "--config", str(run.config), "--party-id", str(k),
            "--label-party", link, *(where or ("--run-dir", str(run.root))), *tap, *tls),
            f"passive_party_{k}.log"))
    return roles


def _relay(cfg: ExperimentConfig, run: RunDir, k: int, label_party: str) -> RoleLaunch:
    """The emulated wide-area link between passive party k and the label party."""
    n = cfg.network
    bandwidth = ("--bandwidth-mbit", str(n.bandwidth_mbit)) if n.bandwidth_mbit else ()
    return RoleLaunch(f"relay {k}", (
        "orchestration", "relay", "--to", label_party, "--latency-ms", str(n.one_way_latency_ms),
        "--jitter-ms", str(n.jitter_ms), *bandwidth, "--seed", str(link_seed(cfg.run.seed, k)),
        "--port-file", str(run.relay_address(k))), f"relay_{k}.log", essential=False, serves=True)


def address_files(cfg: ExperimentConfig, run: RunDir) -> list[Path]:
    """Every address file a launch writes: a resumed run's old ones must go first."""
    files = [run.label_party_address, run.attacker_address, run.routed_address]
    return files + [run.relay_address(k) for k in range(1, cfg.topology.passive_parties + 1)]
