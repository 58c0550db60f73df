"""The launch plan of a run: which roles start, in what order, as whom, and who taps whom.

One plan for every way a run starts: `splitleak run` (each role a local process, all at
once; a role that reaches another names that role's address file, `@FILE`,
splitleak.addresses, and reads it only when it connects, so imports, data loading and model
building overlap), the Ray engine (one actor per role, started in `start_order`) and
deploy/make_compose.py (one container per role, `needs` as its depends_on). The plan itself
imports only the standard library, so the compose generator runs with any Python 3."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from splitleak.artifacts.paths import RunDir
    from splitleak.config import ExperimentConfig

LABEL_PARTY, SIDECAR, PASSIVE_PARTY, RELAY = "label_party", "attacker", "passive_party", "relay"


@dataclass(frozen=True)
class Topology:
    """What decides a run's roles: the parties, the taps, the sidecar and the shaped links."""

    passive_parties: int
    tapped: frozenset[int] = frozenset()  # passive parties whose received gradients are recorded
    received: frozenset[int] = frozenset()  # parties whose activations the label party's tap records
    sidecar_essential: bool = True  # attacker.on_sidecar_failure = "fail"
    shaped: bool = False  # [network]: a shaping relay on each passive party's link

    @property
    def sidecar(self) -> bool:
        return bool(self.tapped or self.received)


@dataclass(frozen=True)
class Role:
    """One process of a run. `reaches`: the role it connects to (a passive party: the label
    party, or its relay); `taps`: the sidecar, when it sends records there."""

    kind: str
    party: int | None = None
    reaches: str | None = None
    taps: str | None = None
    essential: bool = True  # its failure fails the run
    serves_until_stopped: bool = False  # a relay: nothing waits for its end

    @property
    def key(self) -> str:
        """label_party, attacker, passive_party_K, relay_K: its log file and Ray role name."""
        return self.kind if self.party is None else f"{self.kind}_{self.party}"

    @property
    def name(self) -> str:
        """How messages name it: label party, attacker sidecar, passive party K, relay K."""
        return "attacker sidecar" if self.kind == SIDECAR else self.key.replace("_", " ")

    @property
    def service(self) -> str:
        """Its container and TLS identity: label-party, attacker, passive-party-K, relay-K."""
        return self.key.replace("_", "-")

    @property
    def listens(self) -> bool:
        return self.kind != PASSIVE_PARTY

    @property
    def needs(self) -> tuple[str, ...]:
        """The roles that must serve before this one connects to them."""
        return tuple(r for r in (self.taps, self.reaches) if r is not None)


def roles(topology: Topology) -> list[Role]:
    """The label party first (a local Ctrl-C reaches it first), then the sidecar, then each
    passive party behind its relay, if any."""
    sidecar = SIDECAR if topology.sidecar else None
    plan = [Role(LABEL_PARTY, taps=sidecar if topology.received else None)]
    if sidecar:
        plan.append(Role(SIDECAR, essential=topology.sidecar_essential))
    for k in range(1, topology.passive_parties + 1):
        reaches = LABEL_PARTY
        if topology.shaped:
            plan.append(Role(RELAY, k, reaches=LABEL_PARTY, essential=False,
                             serves_until_stopped=True))
            reaches = f"{RELAY}_{k}"
        plan.append(Role(PASSIVE_PARTY, k, reaches=reaches,
                         taps=sidecar if k in topology.tapped else None))
    return plan


def start_order(plan: list[Role]) -> list[Role]:
    """The plan with every role after the roles it needs (for engines that start roles one by
    one and hand each the addresses of those it reaches)."""
    started: list[Role] = []
    pending = list(plan)
    while pending:
        ready = next(r for r in pending if all(n in {s.key for s in started} for n in r.needs))
        pending.remove(ready)
        started.append(ready)
    return started


def topology_of(cfg: ExperimentConfig) -> Topology:
    return Topology(cfg.topology.passive_parties, frozenset(cfg.tapped_parties),
                    frozenset(cfg.received_parties),
                    cfg.attacker.on_sidecar_failure == "fail", cfg.network.shaped)


@dataclass(frozen=True)
class RoleLaunch:
    """One local process of the run: `python -m <args>`, its output in logs/<log>."""

    name: str
    args: tuple[str, ...]
    log: str
    essential: bool = True
    serves: bool = False  # serves until the run stops it (never waited for)


def passive_name(k: int) -> str:
    return Role(PASSIVE_PARTY, k).name


def launch_plan(cfg: ExperimentConfig, run: RunDir, resume: bool = False,
                routed: bool = False) -> list[RoleLaunch]:
    """Every role of the plan as a local process. `routed`: the parties reach the label party
    at the address the orchestrator writes to `run.routed_address` (the bench's relay)."""
    address = {LABEL_PARTY: run.routed_address if routed else run.label_party_address,
               SIDECAR: run.attacker_address}
    address |= {f"{RELAY}_{k}": run.relay_address(k)
                for k in range(1, cfg.topology.passive_parties + 1)}
    where = ("--resume", str(run.root)) if resume else None
    tls = ("--tls-dir", str(run.tls)) if cfg.topology.tls else ()
    launches = []
    for role in roles(topology_of(cfg)):
        tap = ("--attacker", f"@{address[role.taps]}") if role.taps else ()
        reach = f"@{address[role.reaches]}" if role.reaches else ""
        if role.kind == LABEL_PARTY:
            args: tuple[str, ...] = (
                "label_party", "serve", "--config", str(run.config),
                *(where or ("--run-dir", str(run.root))), "--port-file", str(run.label_party_address),
                "--listen", cfg.topology.label_party_address, *tls, *tap)
        elif role.kind == SIDECAR:
            args = ("attacker", "serve", "--listen", "127.0.0.1:0",
                    *(where or ("--out", str(run.root))), "--config", str(run.config),
                    "--run-id", run.root.name, "--port-file", str(run.attacker_address), *tls)
        elif role.kind == RELAY:
            args = _relay(cfg, role.party or 0, reach, run.relay_address(role.party or 0))
        else:
            args = ("passive_party", "run", "--config", str(run.config), "--party-id",
                    str(role.party), "--label-party", reach,
                    *(where or ("--run-dir", str(run.root))), *tap, *tls)
        launches.append(RoleLaunch(role.name, args, f"{role.key}.log", role.essential,
                                   role.serves_until_stopped))
    return launches


def _relay(cfg: ExperimentConfig, k: int, label_party: str, port_file: Path) -> tuple[str, ...]:
    """The emulated wide-area link between passive party k and the label party."""
    from orchestration.relay import link_seed

    n = cfg.network
    bandwidth = ("--bandwidth-mbit", str(n.bandwidth_mbit)) if n.bandwidth_mbit else ()
    return ("orchestration", "relay", "--to", label_party, "--latency-ms",
            str(n.one_way_latency_ms), "--jitter-ms", str(n.jitter_ms), *bandwidth,
            "--seed", str(link_seed(cfg.run.seed, k)), "--port-file", str(port_file))


def address_files(cfg: ExperimentConfig, run: RunDir) -> list[Path]:
    """Every address file a launch writes: a resumed run's old ones must go first."""
    files = [run.label_party_address, run.attacker_address, run.routed_address]
    return files + [run.relay_address(k) for k in range(1, cfg.topology.passive_parties + 1)]
