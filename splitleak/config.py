"""The experiment file: one TOML, validated once at start, frozen, hashed."""

from __future__ import annotations

import hashlib
import json
import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from splitleak.filekind import not_a_file
from splitleak.settings import (
    MAX_BATCH,
    MAX_EPOCHS,
    MAX_RATE,
    MAX_STEPS,
    MAX_WIDTH,
    Settings,
    StrictInt,
    StrictPositiveFloat,
    StrictPositiveInt,
)
from splitleak.threat import ThreatConfig, migration_message
from splitleak.unknown_keys import unknown_key_hint

PROTOCOL_VERSION = 2  # 2: checkpoints and resume in the Train stream and the training plan


class ConfigError(ValueError):
    """A config that cannot run; the message names the field and what is allowed."""


MAX_THREADS = 4096  # torch threads of one process
MAX_EMBEDDING = 4096  # per categorical field: wider asks gigabytes of a vocabulary's table
MAX_QUEUE = 65_536  # records in flight to the sidecar
# A deadline's longest wait, one week: no step or join needs longer, and a gRPC deadline fails at
# once from about 7e9 s on (the int64 nanoseconds of its absolute time overflow).
MAX_DEADLINE_S = 604_800

# A run's directory is `<run.name>[-suffix]-<time>-<hash>` (32 characters after the name, a
# suffix such as "-relayed"), a sweep's is `<sweep.name>`: each must stay one plain directory
# name within the 255 bytes a file system allows.
RUN_NAME_MAX = 200
DIRECTORY_NAME_MAX = 255


def plain_directory_name(value: str) -> str:
    """A name used as one directory: not `.` or `..` (which would write outside its parent)."""
    if value in (".", ".."):
        raise ValueError(f"{value!r} is not a directory name of its own; use letters, digits, "
                         "'_', '.' or '-' (e.g. 'experiment')")
    return value


DIRECTORY_NAME = r"^[A-Za-z0-9_.-]+$"


ColumnRange = tuple[StrictInt, StrictInt]

# A party's share of the columns, relative to the others': far above any published split (GAFM's
# 2:2:1), low enough that the shares' sum stays finite (1e308 each overflowed it to inf).
MAX_RATIO = 1e6


DEVICE = r"^(auto|cpu|cuda(:[0-9]{1,2})?)$"


class RunConfig(Settings):
    name: str = Field("experiment", pattern=DIRECTORY_NAME, max_length=RUN_NAME_MAX)
    seed: int = Field(0, ge=0, lt=2**63)
    output_dir: Path = Path("runs")
    # Intra-op threads per party process; "auto": the cores shared among the run's processes
    # by their part of a step's compute (splitleak.placement), every core in process.
    torch_threads: int | Literal["auto"] = "auto"
    # Where every role computes: "auto" (CUDA where torch sees a GPU, else the CPU), "cpu",
    # "cuda" or "cuda:K"; `devices` overrides it per role: "label", "1".."N", "attacker".
    device: str = Field("auto", pattern=DEVICE)
    devices: dict[str, Annotated[str, Field(pattern=DEVICE)]] = {}
    deterministic: bool = True  # torch's deterministic algorithms (GPU: slower, reproducible)
    # On CUDA, each passive party replays its train step's forward and backward as two CUDA
    # graphs instead of launching every kernel (splitleak.cuda_graphs); no effect on the CPU.
    cuda_graphs: bool = False

    _plain_name = field_validator("name")(plain_directory_name)

    @field_validator("torch_threads")
    @classmethod
    def _threads(cls, value: int | str) -> int | str:
        if value != "auto" and not 0 < int(value) <= MAX_THREADS:
            raise ValueError(f"{value} threads; allowed: 'auto' or 1..{MAX_THREADS}")
        return value


class SubsetConfig(Settings):
    """Train on a seeded random fraction of the split's train rows (and of its test rows):
    quick selection sweeps such as GAFM's Δ selection on random 10 % subsets."""

    fraction: float = Field(gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, lt=2**63)  # None: the run seed


class DatasetConfig(Settings):
    name: str
    params: dict[str, Any] = {}
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    subset: SubsetConfig | None = None  # a number is read as {fraction = number}

    @field_validator("subset", mode="before")
    @classmethod
    def _fraction(cls, value: Any) -> Any:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number or value is None or isinstance(value, dict | SubsetConfig)):
            raise ValueError(f"{_kind_of(value)} is not a subset; give its fraction of the rows "
                             "(e.g. subset = 0.1) or a table (subset = { fraction = 0.1, seed = 7 })")
        return {"fraction": value} if number else value


class FeatureConfig(Settings):
    """Which columns each party holds: explicit half-open ranges, or ratios over all columns."""

    passive: list[ColumnRange] | None = None
    ratios: list[Annotated[StrictPositiveFloat, Field(le=MAX_RATIO)]] | None = None
    label_party: ColumnRange | None = None  # the label party's own features (may overlap)
    allow_overlap: bool = False  # passive parties may share columns (otherwise: a warning)

    @model_validator(mode="after")
    def _one_way(self) -> FeatureConfig:
        if (self.passive is None) == (self.ratios is None):
            raise ValueError("give exactly one of features.passive (column ranges) or features.ratios")
        for r in (self.passive or []) + ([self.label_party] if self.label_party else []):
            if not 0 <= r[0] < r[1]:
                raise ValueError(f"column range {list(r)} must be [start, stop) with 0 <= start < stop")
        return self


class ModelConfig(Settings):
    kind: Literal["mlp", "wide_deep", "cnn", "resnet"] = "mlp"
    # mlp/wide_deep: deep widths; cnn: fc widths after the convs; resnet: the top's fc widths
    layers: list[Annotated[StrictInt, Field(gt=0, le=MAX_WIDTH)]] = [64, 64]
    depth: Literal[18, 34] = 18  # resnet: torchvision's ResNet-18 or -34 (CIFAR stem)
    # cnn: one conv block per entry
    channels: list[Annotated[StrictInt, Field(gt=0, le=MAX_WIDTH)]] = [16, 32]
    cut_layer: PositiveInt = 1  # layers on the passive side (cnn: conv blocks, then fc layers)
    embedding_dim: int = Field(4, gt=0, le=MAX_EMBEDDING)  # per categorical field, deep part
    top: Literal["mlp", "none"] = "mlp"  # none: logits = sum of the parties' outputs
    aggregation: Literal["concat", "sum", "mean"] = "concat"

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        if self.kind == "resnet":
            if self.cut_layer != 1:
                raise ValueError("model.kind = 'resnet' cuts after the pooled features (Fu et "
                                 "al.'s bottom): leave model.cut_layer out")
            if self.top == "none" and self.aggregation != "sum":
                raise ValueError("top = 'none' sums the parties' logits: set aggregation = 'sum'")
            return self
        bottom_depth = len(self.layers) + (len(self.channels) if self.kind == "cnn" else 0)
        if self.cut_layer > bottom_depth:
            unit = "conv blocks and fc layers" if self.kind == "cnn" else "layers"
            raise ValueError(f"cut_layer={self.cut_layer} exceeds the {bottom_depth} {unit}")
        if self.top == "none":
            if self.aggregation != "sum":
                raise ValueError("top = 'none' sums the parties' logits: set aggregation = 'sum'")
            if self.kind == "cnn" and self.cut_layer != len(self.channels):
                raise ValueError("top = 'none' puts every conv block on the passive side: "
                                 f"set cut_layer = {len(self.channels)}")
            if self.kind != "cnn" and self.cut_layer != len(self.layers):
                raise ValueError("top = 'none' puts every layer on the passive side: "
                                 f"set cut_layer = {len(self.layers)}")
        return self


class OptimizerConfig(Settings):
    name: Literal["adam", "sgd", "adagrad"] = "adam"
    lr: float = Field(1e-3, gt=0.0, le=MAX_RATE)
    momentum: float = Field(0.0, ge=0.0, lt=1.0)  # SGD's only
    weight_decay: float = Field(0.0, ge=0.0, le=MAX_RATE)

    @model_validator(mode="after")
    def _momentum_is_sgds(self) -> OptimizerConfig:
        if self.momentum and self.name != "sgd":
            raise ValueError(f"momentum = {self.momentum} is SGD's; {self.name} takes none "
                             "(allowed: name = \"sgd\" with momentum, or no momentum)")
        return self


class TrainingConfig(Settings):
    batch_size: int = Field(256, gt=0, le=MAX_BATCH)
    epochs: int = Field(1, gt=0, le=MAX_EPOCHS)
    eval_interval: int = Field(0, ge=0, le=MAX_STEPS)  # train steps between evaluations; 0 = each epoch end
    # stop after this many train steps (smoke runs, bench)
    max_steps: int | None = Field(None, gt=0, le=MAX_STEPS)
    precision: Literal["fp32", "bf16"] = "fp32"  # bf16: the models run under autocast
    eval_train: bool = False  # the final evaluation also scores the train rows (train_auc, ...)
    loss: Literal["auto", "bce", "ce"] = "auto"
    optimizer: OptimizerConfig = OptimizerConfig()
    # Per-party overrides: key "label" or a passive party id "1".."N".
    optimizers: dict[str, OptimizerConfig] = {}
    # Train steps between coordinated checkpoints of every party (0: none). At 100 a resumed
    # run redoes at most 100 steps, and the checkpoint's cost (a few small files, fsync'd,
    # per party) stays around 1 % of the steps between two checkpoints (docs/reliability.md).
    checkpoint_every: int = Field(100, ge=0, le=MAX_STEPS)


ADDRESS = r"^[^\s:]+:\d{1,5}$"  # HOST:PORT


def port_in_range(address: str) -> str:
    """A HOST:PORT whose port a socket can have (0: any free port)."""
    port = int(address.rsplit(":", 1)[1])
    if port > 65535:
        raise ValueError(f"port {port} of {address!r} is not a TCP port (0..65535; 0: any free port)")
    return address


class TopologyConfig(Settings):
    passive_parties: int = Field(2, ge=1, le=64)
    label_party_address: str = Field("127.0.0.1:0", pattern=ADDRESS)
    step_deadline_s: float = Field(60.0, gt=0, le=MAX_DEADLINE_S)
    join_deadline_s: float = Field(120.0, gt=0, le=MAX_DEADLINE_S)
    max_message_mb: int = Field(64, ge=1, le=1024)
    tls: bool = True  # mutual TLS, one identity per party; false: plaintext (trusted network only)

    _port = field_validator("label_party_address")(port_in_range)


def plugin_list(value: Any, how: str) -> Any:
    """A list of plug-ins as written: names or tables (`{"name": ...}` each); a single table
    (TOML's [defense] where [[defense]] was meant) is refused, saying `how` to write a list."""
    if isinstance(value, dict):
        raise ValueError(f"a list is expected, not one table; write {how}")
    if isinstance(value, str):
        raise ValueError(f"a list is expected, not the text {value!r}; write {how}")
    if not isinstance(value, list | tuple):
        raise ValueError(f"a list is expected, not {_kind_of(value)}; write {how}")
    for i, v in enumerate(value):
        if not isinstance(v, str | dict | PluginSpec):
            raise ValueError(f"item {i} is {_kind_of(v)}, not a plug-in's name or table; write {how}")
    return [{"name": v} if isinstance(v, str) else v for v in value]


def _kind_of(value: Any) -> str:
    """e.g. `the number 0.5`, `the boolean false`, for a message naming what was written."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value}"
    return f"a {type(value).__name__} ({value!r})"


class PluginSpec(Settings):
    """A plug-in by registry name plus its parameters (validated by the plug-in's own model)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    name: str

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


MIN_BANDWIDTH_MBIT = 0.01


class NetworkConfig(Settings):
    """An emulated wide-area link between each passive party and the label party: `splitleak
    run` puts a shaping relay (orchestration/relay.py) on each party's connection when set. A
    round trip, twice the latency, must stay under topology.join_deadline_s (a party's Join)
    and topology.step_deadline_s (a train step); under the latter too, that round trip plus a
    full batch's activation at bandwidth_mbit, with the previous step's cut gradient unless an
    evaluation or checkpoint after every step carries it, and plus an evaluation batch's
    activation (test rows) with the last cut gradient (checked where their bytes are known
    before the run: no gzip / deflate, no sparse wire)."""

    one_way_latency_ms: float = Field(0.0, ge=0.0, le=10_000.0)
    jitter_ms: float = Field(0.0, ge=0.0, le=10_000.0)  # std of the one-way latency (normal)
    # Per direction and party link; None: unlimited. At least 0.01 Mbit/s (a 64 KiB chunk then
    # takes 52 s): below that every connection stalls, whatever the deadlines.
    bandwidth_mbit: float | None = Field(None, ge=MIN_BANDWIDTH_MBIT)

    @property
    def shaped(self) -> bool:
        return bool(self.one_way_latency_ms or self.jitter_ms or self.bandwidth_mbit)

    def describe(self, compact: bool = False) -> str:
        """`LAN`, or e.g. `25 ± 2 ms one-way, 100 Mbit/s` (compact: `25±2 ms, 100 Mbit/s`)."""
        if not self.shaped:
            return "LAN"
        parts = []
        if self.one_way_latency_ms or self.jitter_ms:
            latency = f"{self.one_way_latency_ms:g}"
            if self.jitter_ms:
                latency += f"±{self.jitter_ms:g}" if compact else f" ± {self.jitter_ms:g}"
            parts.append(f"{latency} ms" + ("" if compact else " one-way"))
        if self.bandwidth_mbit:
            parts.append(f"{self.bandwidth_mbit:g} Mbit/s")
        return ", ".join(parts)


class WireConfig(Settings):
    """How cut-layer tensors travel between the parties (DESIGN.md §3). Anything but float32 is
    a lossy compression, and so a defense too: the tap records what the passive party received."""

    dtype: Literal["float32", "float16", "bfloat16"] = "float32"  # activations and gradients
    compression: Literal["none", "gzip", "deflate"] = "none"  # gRPC message compression
    # Send a tensor as (int32 positions, values) when that is smaller than dense: below density
    # ½ for float32, ⅓ for 16-bit floats (e.g. the `sparsify` defense's gradients, ReLU
    # activations). Exact: it changes bytes on the wire, never a value.
    sparse: bool = False

    def describe(self) -> str:
        """e.g. `float16, sparse, gzip`."""
        return ", ".join([self.dtype] + (["sparse"] if self.sparse else [])
                         + ([self.compression] if self.compression != "none" else []))


class AttackerConfig(Settings):
    """The sidecar and the offline analysis: what is recorded and which attacks run."""

    enabled: bool = True
    record_first_layer: bool = True  # also the gradient at the party's first layer
    record_activation: bool = False  # also the activation the party sent
    # records in flight before the tap applies backpressure; `splitleak validate` checks they
    # fit 4096 MiB
    queue_size: int = Field(64, gt=0, le=MAX_QUEUE)
    on_sidecar_failure: Literal["fail", "continue"] = "fail"  # continue: record the gap
    # empty: every default attack for the run's task and the threat model's run-level attacks;
    # a named list is exactly what runs (validate warns of the run-level ones it leaves out)
    attacks: list[PluginSpec] = []

    @model_validator(mode="before")
    @classmethod
    def _moved_to_threat(cls, value: Any) -> Any:
        if isinstance(value, dict):
            moved = [key for key in ("observe", "hints") if key in value]
            if moved:
                raise ValueError(migration_message(value))
        return value

    @field_validator("attacks", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        return plugin_list(value, 'attacks = ["norm", ...] or [[attacker.attacks]] tables')


class ProtectionConfig(Settings):
    """Input-side protection: passive parties that transform their own images before training
    (ALGORITHMS.md §5, Anti-GAN); absent: none."""

    name: str = "none"  # a registered protection (passive_party/protections/), or none
    parties: list[StrictPositiveInt] = []  # the image-owning passive parties that protect their inputs
    params: dict[str, Any] = {}  # the protection's parameters

    def applies(self, party_id: int) -> bool:
        return self.name != "none" and party_id in self.parties

    def describe(self) -> str:
        """e.g. `antigan on parties 1 (lambda_obf=250)`; `none`."""
        if self.name == "none" or not self.parties:
            return "none"
        args = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return (f"{self.name} on part{'y' if len(self.parties) == 1 else 'ies'} "
                f"{', '.join(map(str, self.parties))}" + (f" ({args})" if args else ""))


class EvaluationConfig(Settings):
    """Evaluation-only artifacts the run writes beside training, never sent on the wire. Left
    out, validation resolves each from the attacks and the threat model, and the run
    directory's config.toml records what it resolved."""

    # tapped parties whose clean anchors the label party writes (the cosine oracle's side
    # knowledge); may be given, as a subset of the tapped parties ([] writes none)
    clean_anchors: list[StrictPositiveInt] | None = None
    # white-box parties whose label-party model snapshots are written (threat.parties.K.white_box)
    white_box_snapshots: list[StrictPositiveInt] | None = None
    # passive parties whose activations the label party's tap records (threat.receiver.victims)
    received_activations: list[StrictPositiveInt] | None = None

    @property
    def resolved(self) -> bool:
        return None not in (self.clean_anchors, self.white_box_snapshots, self.received_activations)


class ExperimentConfig(Settings):
    run: RunConfig = RunConfig()
    dataset: DatasetConfig
    features: FeatureConfig
    model: ModelConfig = ModelConfig()
    training: TrainingConfig = TrainingConfig()
    topology: TopologyConfig = TopologyConfig()
    objective: PluginSpec = PluginSpec(name="cross_entropy")  # what the label party learns from
    defense: list[PluginSpec] = []  # gradient defense chain, applied in order
    attacker: AttackerConfig = AttackerConfig()
    wire: WireConfig = WireConfig()  # dtype and compression of what travels between parties
    network: NetworkConfig = NetworkConfig()  # emulated latency / bandwidth between parties
    threat: ThreatConfig = ThreatConfig()  # who attacks, what they know and do (DESIGN.md §1)
    protection: ProtectionConfig = ProtectionConfig()  # input-side protection (Anti-GAN)
    evaluation: EvaluationConfig = EvaluationConfig()  # evaluation-only artifacts (resolved)

    @model_validator(mode="after")
    def _parties(self) -> ExperimentConfig:
        n = self.topology.passive_parties
        given = len(self.features.passive or self.features.ratios or [])
        if given != n:
            which = "passive" if self.features.passive is not None else "ratios"
            raise ValueError(f"features.{which} lists {given} parties but "
                             f"topology.passive_parties = {n}")
        allowed = {"label"} | {str(k) for k in range(1, n + 1)}
        bad = sorted(set(self.training.optimizers) - allowed)
        if bad:
            raise ValueError(f"training.optimizers has unknown party {bad}; allowed keys: "
                             f"{', '.join(sorted(allowed))}")
        self.threat.check_parties(n)
        for k in self.threat.malicious:
            name = self.optimizer_for(str(k)).name
            if name != "sgd":
                raise ValueError(
                    f"threat.parties.{k}.optimizer = 'malicious' is Fu et al.'s malicious SGD: party "
                    f"{k} trains with '{name}'; set training.optimizers.\"{k}\" = {{ name = \"sgd\", "
                    "lr = 0.1, momentum = 0.9 } (its lr, momentum and weight decay are used)")
        if self.threat.receiver.victims:
            self._check_receiver()
        self._check_protection_parties()
        self._check_network()
        if self.model.kind == "wide_deep" and self.features.label_party is None:
            raise ValueError("model.kind = 'wide_deep' puts the wide part on the label party: "
                             "give it features (features.label_party = [start, stop])")
        return self

    def _check_protection_parties(self) -> None:
        strangers = sorted(set(self.protection.parties) - set(range(1, self.topology.passive_parties + 1)))
        if strangers:
            raise ValueError(f"protection.parties names {strangers}; this run has passive parties "
                             f"1..{self.topology.passive_parties}")

    def _check_network(self) -> None:
        """A train step crosses the emulated link twice (the batch out, the activation back),
        and so does a party's Join (the call out, the plan back): a round trip at or over the
        step (join) deadline fails every step (every party's join), after the deadline."""
        round_trip_s = 2 * self.network.one_way_latency_ms / 1e3
        for what, field, outcome, room in (
                ("train step's", "step_deadline_s", "step would time out", "the step's compute"),
                ("party's join", "join_deadline_s", "party would fail to join", "connecting")):
            deadline = getattr(self.topology, field)
            if round_trip_s >= deadline:
                raise ValueError(
                    f"network.one_way_latency_ms = {self.network.one_way_latency_ms:g} makes every "
                    f"{what} round trip {round_trip_s:g} s, at or over topology.{field} = "
                    f"{deadline:g}, so every {outcome}; raise topology.{field} above "
                    f"{round_trip_s:g} (with room for {room} and jitter) or lower the latency")

    def _check_receiver(self) -> None:
        """Feature reconstruction (ALGORITHMS.md §2.11) reads the activations the label party's
        tap records: the sidecar must run."""
        if not self.attacker.enabled:
            raise ValueError(f"threat.receiver.victims = {self.threat.receiver.victims} needs "
                             "attacker.enabled = true (the sidecar records what the label party "
                             "receives from them)")

    @field_validator("objective", mode="before")
    @classmethod
    def _objective(cls, value: Any) -> Any:
        if not isinstance(value, str | dict | PluginSpec):
            raise ValueError(f"{_kind_of(value)} is not a plug-in's name or table; write "
                             'objective = "name", or an [objective] table with name = "..." and '
                             "its parameters")
        return {"name": value} if isinstance(value, str) else value

    @field_validator("defense", mode="before")
    @classmethod
    def _chain(cls, value: Any) -> Any:
        return plugin_list(value, "one [[defense]] table per defense (double brackets), or "
                                  'defense = ["name", ...]')

    def loss_for(self, num_classes: int) -> str:
        """The loss this run trains with: 'bce' (one logit) or 'ce' (one logit per class)."""
        loss = self.training.loss
        if loss == "auto":
            return "bce" if num_classes == 2 else "ce"
        if loss == "bce" and num_classes != 2:
            raise ConfigError(f"training.loss = 'bce' needs a binary dataset; {self.dataset.name} "
                              f"has {num_classes} classes (allowed: 'ce', 'auto')")
        return loss

    def output_width(self, num_classes: int) -> int:
        return 1 if self.loss_for(num_classes) == "bce" else num_classes

    def optimizer_for(self, party: str) -> OptimizerConfig:
        return self.training.optimizers.get(party, self.training.optimizer)

    @property
    def received_parties(self) -> list[int]:
        """Passive parties whose activations the label party's tap records (none if disabled)."""
        return sorted(self.threat.receiver.victims) if self.attacker.enabled else []

    @property
    def artifacts(self) -> EvaluationConfig:
        """The evaluation artifacts this run writes, as validation resolved them; ConfigError for
        a config that did not go through validation (splitleak.validation.validate)."""
        if not self.evaluation.resolved:
            raise ConfigError("the config's [evaluation] artifacts are unresolved: a role's config "
                              "goes through splitleak.validation.validate first")
        return self.evaluation

    @property
    def sidecar_needed(self) -> bool:
        return bool(self.tapped_parties or self.received_parties)

    @property
    def tapped_parties(self) -> list[int]:
        """Passive parties whose received gradients the sidecar records (none if disabled)."""
        return self.threat.curious if self.attacker.enabled else []

    def to_toml(self) -> str:
        return tomli_w.dumps(_drop_none(self.model_dump(mode="json")))

    @property
    def hash(self) -> str:
        """The experiment's identity. [evaluation] is left out: it follows from the rest (or
        picks which evaluation-only files to write), so resolving it keeps the hash."""
        return _digest(self.model_dump(mode="json", exclude={"evaluation"}))

    def section_hashes(self) -> dict[str, str]:
        """The hash of each top-level section that `hash` covers: two configs whose hashes
        differ differ in the sections whose hashes differ."""
        data = self.model_dump(mode="json", exclude={"evaluation"})
        return {section: _digest(value) for section, value in data.items()}

    def field_hashes(self) -> dict[str, str]:
        """The hash of each field that `hash` covers, by dotted name ("training.lr"; a table
        of a list by its index, "defense.0.s"): two configs whose hashes differ differ in the
        fields whose hashes differ, or that one of them lacks. An empty table or list has no
        field of its own."""
        return {name: _digest(value) for name, value in
                leaves(self.model_dump(mode="json", exclude={"evaluation"}))}


def leaves(data: Any, name: str = "") -> list[tuple[str, Any]]:
    """(dotted name, value) of every field under `data` that is neither a table nor a list of
    tables; an empty table or list has none."""
    if isinstance(data, list) and data and all(isinstance(item, dict) for item in data):
        data = {str(index): item for index, item in enumerate(data)}
    if isinstance(data, dict):
        return [leaf for key, value in data.items()
                for leaf in leaves(value, f"{name}.{key}" if name else str(key))]
    return [] if data == [] else [(name, data)]


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of every field whose value differs, "name: old -> new", sorted."""
    found = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            found += differences(a, b, f"{name}.")
        elif a != b:
            found.append(f"{name}: {_shown(a)} -> {_shown(b)}")
    return found


def _shown(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _drop_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


# Pydantic's words before a validator's own sentence: noise to a user, who reads the sentence.
_NOISE = {"value_error": "Value error, ", "assertion_error": "Assertion failed, "}


_BOUNDS = {"less_than_equal": "le", "less_than": "lt", "greater_than": "gt",
           "greater_than_equal": "ge"}


def error_sentence(error: Any) -> str:
    """One pydantic error's message as a user reads it: a validator's own sentence without
    pydantic's "Value error, " before it; pydantic's own messages as they are, but a large float
    bound as 1e+30, not its 31 digits."""
    msg = str(error["msg"])
    noise = _NOISE.get(error["type"], "")
    if noise and msg.startswith(noise):
        return msg[len(noise):]
    bound = (error.get("ctx") or {}).get(_BOUNDS.get(error["type"], ""))
    head, _, written = msg.rpartition(" ")
    if isinstance(bound, float) and abs(bound) >= 1e7 and written.lstrip("-").isdigit():
        return f"{head} {bound:g}"
    return msg


def error_line(where: str, error: Any) -> str:
    """"<field path>: <sentence>"; a check across sections (no path of its own) is its sentence
    alone, which names the fields it compares."""
    return f"{where}: {error_sentence(error)}" if where else error_sentence(error)


def _hint(error: Any, model: type[BaseModel] | None) -> str:
    """For an unknown key: the nearest key `model`'s table allows, and the keys it allows."""
    return unknown_key_hint(model, tuple(error["loc"])) if error["type"] == "extra_forbidden" else ""


def format_validation_error(err: ValidationError, source: str, what: str = "config",
                            model: type[BaseModel] | None = None) -> str:
    """Every error of `err` on its own line; `model`: the model validated, whose allowed keys
    an unknown key's line names."""
    lines = [f"invalid {what} {source}:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        lines.append(f"  {error_line(loc, e)}{_got(e)}{_hint(e, model)}")
    return "\n".join(lines)


def _got(error: Any) -> str:
    """` (got VALUE)`: the value an error is about, as written; nothing for a missing key or a
    whole table (a check across its fields, whose sentence names them)."""
    got = error.get("input")
    return "" if isinstance(got, dict) or error["type"] == "missing" else f" (got {got!r})"


def plugin_param_errors(prefix: str, err: ValidationError,
                        model: type[BaseModel] | None = None) -> str:
    """A plug-in's parameter errors, each under the config path `prefix` it came from and with
    the value given, as a config field's; `model`: its parameter model, whose allowed keys an
    unknown key's error names."""
    return "; ".join(error_line(".".join([prefix, *map(str, e["loc"])]), e) + _got(e)
                     + _hint(e, model) for e in err.errors())


def parse_config(data: dict[str, Any], source: str = "<dict>") -> ExperimentConfig:
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source, model=ExperimentConfig)) from None


def read_toml_text(path: Path, what: str, error: type[Exception]) -> str:
    """A TOML file's text (a leading byte-order mark, as some editors write, dropped); `error`
    (naming `what` and the reason) if it cannot be read or is not UTF-8, as TOML requires."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise error(f"invalid {what} {path}: not UTF-8 text (byte {err.object[err.start]:#04x} at "
                    f"offset {err.start}); a TOML file is UTF-8") from None
    except OSError as err:
        raise error(f"cannot read {what} {path}: {err.strerror or err}") from None


def load_config(path: str | Path | None = None) -> ExperimentConfig:
    """Read and validate an experiment file; None gives the built-in default."""
    if path is None:
        text = resources.files("splitleak.configs").joinpath("default.toml").read_text()
        source = "(built-in default)"
    else:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} {not_a_file(p)}; give the path of a config TOML file")
        text = read_toml_text(p, "config", ConfigError)
        source = str(p)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"invalid config {source}: not valid TOML: {err}") from None
    if not data:
        raise ConfigError(f"invalid config {source}: it is empty (it holds no setting); an "
                          "experiment names at least its [dataset] and [features]")
    if "sweep" in data:  # [axes] alone, or [[variant]] tables, come with it
        raise ConfigError(f"{source} is a sweep file (it has a [sweep] table), not an "
                          f"experiment: run it with `splitleak sweep {source}`")
    return parse_config(data, source)
