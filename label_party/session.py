"""One training run as the label party sees it: who joined (or was refused), their streams."""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

from label_party.setup import LabelPartyData
from splitleak.artifacts.paths import checkpoint_party_file
from splitleak.checkpoint import Manifest
from splitleak.config import PROTOCOL_VERSION, ExperimentConfig
from splitleak.data_files import data_digests, data_paths
from splitleak.tls import passive_identity
from splitleak.v1 import split_learning_pb2 as pb
from splitleak.validation import expected_embedding_shapes
from splitleak.wire import ECHO_LIMIT, Malformed, RefusalLog, clip, config_map_problem, echo

log = logging.getLogger("label_party")
# A party id in metadata: a few ASCII digits (anything longer is not an id of this run).
_PARTY_ID = re.compile(r"[0-9]{1,6}")
INBOUND_LIMIT = 2  # per stream: the one message asked for, and how the stream ended
NAMED_FIELDS = 10  # differing config fields a refusal names before "and N more"


class SessionError(Exception):
    """A request the session refuses, or why the run failed; carries the gRPC status code.

    `culprit` names what broke the run when it is not the party itself (e.g. the attacker
    sidecar a passive party reported as failed)."""

    def __init__(self, code: grpc.StatusCode, message: str, party_id: int | None = None,
                 culprit: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.party_id = party_id
        self.culprit = culprit or (f"passive party {party_id}" if party_id else "label party")


@dataclass(frozen=True)
class PartyGone:
    """Put on a party's inbound queue when its stream ends, breaks, or is refused."""

    reason: str
    error: SessionError | None = None  # a refusal: the run fails with exactly this


@dataclass
class PartyStream:
    """One party's Train stream. The party may only answer what it was asked: every message
    the label party sends that expects an answer grants one credit, every message the party
    sends spends one; a message without credit is refused, never buffered."""

    party_id: int
    inbound: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(INBOUND_LIMIT))
    outbound: asyncio.Queue = field(default_factory=asyncio.Queue)  # message | SessionError | None
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    credits: int = 0
    asked: bool = False
    ended: bool = False  # the stream broke, closed, or was refused
    why: PartyGone | None = None
    on_end: asyncio.Event | None = None  # the session's: some stream ended

    def ask(self, message: pb.LabelPartyMessage) -> None:
        """Send a message the party must answer."""
        self.credits += 1
        self.asked = True
        self.outbound.put_nowait(message)

    def admit(self, message: pb.PartyMessage | Malformed) -> SessionError | None:
        """Why this inbound message is refused, or None (and its credit is spent)."""
        k = self.party_id
        if isinstance(message, Malformed):
            return SessionError(message.code, f"passive party {k} sent a {message.describe()}", k)
        if message.HasField("failure"):
            return self._reported(message.failure)  # a party may always say why it stops
        if self.credits == 0:
            if not self.asked:
                return SessionError(grpc.StatusCode.FAILED_PRECONDITION,
                                    f"passive party {k} sent a message before it was asked for "
                                    "one (the label party asks with each batch)", k)
            return SessionError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"passive party {k} sent more messages than it was asked for "
                                "(one answer per batch; nothing is buffered)", k)
        self.credits -= 1
        return None

    def _reported(self, failure: pb.PartyFailure) -> SessionError:
        """The run fails with what the party says broke it (e.g. its attacker sidecar)."""
        k = self.party_id
        itself = f"passive party {k}"
        component = clip(failure.component, 40) or itself
        what = f"{itself} stopped" if component == itself else (
            f"{component} failed (reported by {itself})")
        return SessionError(grpc.StatusCode.ABORTED, f"{what}: {clip(failure.message, 500)}", k,
                            culprit=component)

    def refuse(self, error: SessionError) -> None:
        """End this party's stream with `error`, and let the run fail with it."""
        log.warning("ending passive party %d's stream: %s [%s]", self.party_id, error.message,
                    error.code.name)
        self.outbound.put_nowait(error)
        self.gone(PartyGone(error.message, error))

    def gone(self, why: PartyGone) -> None:
        self.ended = True
        self.why = self.why or why
        if self.on_end is not None:
            self.on_end.set()
        try:
            self.inbound.put_nowait(why)
        except asyncio.QueueFull:
            pass  # an earlier message already waits; the stream's end will be seen after it


class Session:
    """Admits the N passive parties, then lends their streams to the step loop."""

    def __init__(self, cfg: ExperimentConfig, data: LabelPartyData, run_id: str,
                 resume: Manifest | None = None, resumed: bool = False) -> None:
        self.cfg = cfg
        self.data = data
        self.run_id = run_id
        self.resume = resume  # the checkpoint this run continues from (None: step 0)
        self.resumed = resumed or resume is not None
        self.tokens: dict[int, str] = {}  # each joined party's own session token
        self.party_ids = list(range(1, cfg.topology.passive_parties + 1))
        # What each party's Join must announce, fixed before anyone can send a shape.
        self.expected_shapes = expected_embedding_shapes(cfg, data.schema)
        self.data_paths = data_paths(cfg)  # each party's copy of these files must match
        self.data_digests = data_digests(cfg)
        self.joined: dict[int, pb.JoinRequest] = {}
        self.refused: dict[int, str] = {}  # the last refusal of each known party id
        self.refusals = RefusalLog(log)
        self.streams: dict[int, PartyStream] = {}
        self.all_streams_open = asyncio.Event()
        self.a_stream_ended = asyncio.Event()
        self.started = False

    # -- admission -----------------------------------------------------------------------
    def _refusal(self, error: SessionError, what: str) -> SessionError:
        """Log a refusal with its reason at this side (the peer only sees the status)."""
        self.refusals.refused(what, error.message, error.code.name)
        if error.party_id in self.party_ids:
            self.refused[error.party_id] = error.message
        return error

    def _check_identity(self, k: int, peer: str | None) -> None:
        """With TLS, a party may only speak for the id its certificate names."""
        if self.cfg.topology.tls and peer != passive_identity(k):
            raise SessionError(grpc.StatusCode.PERMISSION_DENIED,
                               f"the client certificate names {echo(peer)}, which may not act "
                               f"as passive party {k} (expected {passive_identity(k)!r})", k)

    def join(self, request: pb.JoinRequest, peer: str | None = None) -> pb.TrainingPlan:
        try:
            self._admit(request, peer)
        except SessionError as err:
            raise self._refusal(err, f"the Join of passive party {request.party_id}") from None
        self.joined[request.party_id] = request
        self.tokens[request.party_id] = secrets.token_hex(16)  # one party's cannot open another's
        self.refused.pop(request.party_id, None)
        log.info("passive party %d joined", request.party_id)
        return self._plan(request.party_id)

    def _admit(self, request: pb.JoinRequest, peer: str | None) -> None:
        k = request.party_id
        if request.protocol_version != PROTOCOL_VERSION:
            raise SessionError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"protocol version {request.protocol_version} is not supported; "
                               f"this label party speaks version {PROTOCOL_VERSION}", k)
        self._check_known(k)
        self._check_identity(k, peer)
        if k in self.joined:
            raise SessionError(grpc.StatusCode.ALREADY_EXISTS,
                               f"passive party {k} has already joined this run: give each "
                               f"passive party its own --party-id in 1..{len(self.party_ids)} "
                               "(a party that stopped rejoins only when the run is resumed "
                               "with --resume)", k)
        if self.started:
            raise SessionError(grpc.StatusCode.FAILED_PRECONDITION,
                               "training has already started; no party can join now", k)
        for name, hashes in (("config_sections", request.config_sections),
                             ("config_fields", request.config_fields),
                             ("data_digests", request.data_digests)):
            problem = config_map_problem(f"JoinRequest.{name}", hashes)
            if problem is not None:
                raise SessionError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"passive party {k} sent a Join whose {problem}", k)
        if request.config_hash != self.cfg.hash:
            where = (differing_fields(self.cfg.field_hashes(), request.config_fields)
                     or differing_sections(self.cfg.section_hashes(), request.config_sections))
            raise SessionError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"passive party {k} loaded config {echo(request.config_hash)} but "
                               f"the label party runs {self.cfg.hash!r}{where}"
                               ": every party must use the same experiment file", k)
        if request.num_rows != self.data.schema.num_rows:
            raise SessionError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"passive party {k} holds {request.num_rows} rows but the label "
                               f"party has {self.data.schema.num_rows}: sample ids do not align; "
                               "every host needs the same data file, row for row", k)
        self._check_data(k, request.data_digests)
        expected = self.expected_shapes[k]
        if tuple(request.embedding_shape) != expected:
            raise SessionError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"passive party {k} announced embedding shape "
                               f"{echo(list(request.embedding_shape))}, but the shared config "
                               f"gives its bottom model the output shape {list(expected)}", k)

    def _check_data(self, k: int, digests: Mapping[str, str]) -> None:
        """The same config names the same data files on every host: each party's copy must be
        the label party's (another version, sample or order of the rows would train on rows
        whose sample ids do not align, without a word)."""
        other = [f"{key} ({self.data_paths[key]} on the label party's host)" for key, digest
                 in sorted(digests.items()) if self.data_digests.get(key, digest) != digest]
        if other:
            raise SessionError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"passive party {k}'s copy of {', '.join(other)} differs from "
                               "the label party's (another size, or other bytes in its first or "
                               "last MiB): sample ids would not align; every host needs the same "
                               "data file, row for row", k)

    def _plan(self, k: int) -> pb.TrainingPlan:
        plan = self.data.plan
        at = self.resume
        return pb.TrainingPlan(
            run_id=self.run_id, session=self.tokens[k], epochs=plan.epochs,
            batch_size=plan.batch_size, seed=self.cfg.run.seed,
            steps_per_epoch=plan.steps_per_epoch, total_train_steps=plan.total_train_steps,
            eval_interval=plan.eval_interval, num_passive_parties=len(self.party_ids),
            step_deadline_seconds=self.cfg.topology.step_deadline_s,
            resumed=self.resumed, resume_step=at.step if at else 0,
            resume_batches=at.batches if at else 0,
            resume_sha256=at.files.get(checkpoint_party_file(k), "") if at else "",
            checkpoint_every=self.cfg.training.checkpoint_every)

    def _check_known(self, k: int) -> None:
        if k not in self.party_ids:
            raise SessionError(grpc.StatusCode.PERMISSION_DENIED,
                               f"unknown party id {k}; this run has passive parties "
                               f"1..{len(self.party_ids)} (topology.passive_parties): give "
                               "--party-id in that range")

    def open_stream(self, party_id: str | None, token: str | None,
                    peer: str | None = None) -> PartyStream:
        try:
            return self._open(party_id, token, peer)
        except SessionError as err:
            raise self._refusal(err, "a Train stream") from None

    def _open(self, party_id: str | None, token: str | None, peer: str | None) -> PartyStream:
        if party_id is None or not _PARTY_ID.fullmatch(party_id):
            raise SessionError(grpc.StatusCode.UNAUTHENTICATED,
                               f"Train stream without a valid 'splitleak-party-id' metadata "
                               f"entry (got {echo(party_id)}; expected a party id 1..N)")
        k = int(party_id)
        self._check_known(k)
        self._check_identity(k, peer)
        own = self.tokens.get(k, "")
        if k not in self.joined or not secrets.compare_digest((token or "").encode(), own.encode()):
            raise SessionError(grpc.StatusCode.PERMISSION_DENIED,
                               f"passive party {k} opened a Train stream without joining this "
                               "run (call Join first and send its session token)", k)
        if k in self.streams:
            raise SessionError(grpc.StatusCode.ALREADY_EXISTS,
                               f"passive party {k} already has a Train stream open", k)
        stream = self.streams[k] = PartyStream(k, on_end=self.a_stream_ended)
        if len(self.streams) == len(self.party_ids):
            self.started = True
            self.all_streams_open.set()
        return stream

    async def wait_for_parties(self) -> None:
        """Until every party's stream is open; fails at once if one ends before that."""
        opened = asyncio.ensure_future(self.all_streams_open.wait())
        ended = asyncio.ensure_future(self.a_stream_ended.wait())
        try:
            await asyncio.wait([opened, ended], timeout=self.cfg.topology.join_deadline_s,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            opened.cancel()
            ended.cancel()
        for k, stream in self.streams.items():
            if stream.ended and not self.all_streams_open.is_set() and stream.why is not None:
                if stream.why.error is not None:
                    raise stream.why.error
                raise SessionError(grpc.StatusCode.UNAVAILABLE,
                                   f"passive party {k} {stream.why.reason} before training started", k)
        if not self.all_streams_open.is_set():
            missing = [k for k in self.party_ids if k not in self.streams]
            raise SessionError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               "; ".join(self._why_missing(k) for k in missing), missing[0])

    def _why_missing(self, k: int) -> str:
        within = f"within {self.cfg.topology.join_deadline_s:g} s"
        if k in self.joined:
            return f"passive party {k} joined but did not open its Train stream {within}"
        if k in self.refused:
            return f"passive party {k} was refused: {self.refused[k]}"
        return f"passive party {k} did not join {within}"

    def embedding_shapes(self) -> dict[int, tuple[int, ...]]:
        return {k: tuple(self.joined[k].embedding_shape) for k in self.party_ids}

    @property
    def all_connected(self) -> bool:
        """Every party's stream is open and has not ended."""
        return len(self.streams) == len(self.party_ids) and not any(
            s.ended or s.closed.is_set() for s in self.streams.values())

    # -- ending --------------------------------------------------------------------------
    def abort(self, error: SessionError) -> None:
        """Tell every open stream the run is over and why."""
        for k, stream in self.streams.items():
            if error.party_id in (None, k):
                stream.outbound.put_nowait(error)
            else:
                stream.outbound.put_nowait(SessionError(
                    grpc.StatusCode.ABORTED, f"run aborted: {error.message}", error.party_id))

    async def wait_closed(self, timeout: float) -> None:
        """Until every stream has ended, or `timeout` seconds."""
        waits = [asyncio.ensure_future(s.closed.wait()) for s in self.streams.values()]
        if waits:
            _, pending = await asyncio.wait(waits, timeout=timeout)
            for task in pending:
                task.cancel()


def differing_sections(own: dict[str, str], theirs: Mapping[str, str]) -> str:
    """", in [dataset] and [run]": the sections of this config whose hashes a party's differ
    from (a party that sent none: ""). Only this config's own section names are echoed."""
    if not theirs:
        return ""
    differ = [f"[{name}]" for name in sorted(own) if theirs.get(name) != own[name]]
    if not differ:
        return ", in no section of this config (the party's has others)"
    return ", in " + _in_words(differ)


def differing_fields(own: dict[str, str], theirs: Mapping[str, str],
                     limit: int = NAMED_FIELDS) -> str:
    """", in run.seed and training.lr": the fields whose hashes differ between this config and
    a party's, or that one of them lacks, in name order, the first `limit` named, then how many
    more. "" for a party that sent none (one from before config_fields), or where none differs."""
    if not theirs:
        return ""
    differ = sorted(name for name in own.keys() | theirs.keys() if own.get(name) != theirs.get(name))
    if not differ:
        return ""
    named = [clip(name, ECHO_LIMIT) for name in differ[:limit]]  # a party's own names included
    if len(differ) > limit:
        return f", in {', '.join(named)} and {len(differ) - limit} more"
    return ", in " + _in_words(named)


def _in_words(names: list[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
