"""Validation, composed once and used by every CLI: the core's checks of the config against the
dataset, every plug-in group's checks, and the resolution of the run's evaluation artifacts."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import torch
from pydantic import ValidationError
from torch import nn

from splitleak.config import ConfigError, EvaluationConfig, ExperimentConfig, plugin_param_errors
from splitleak.datasets import (
    DATASETS,
    Dataset,
    DatasetError,
    Schema,
    build_dataset,
    check_against_schema,
)
from splitleak.datasets.base import origin
from splitleak.inputs import check_classes, split_ids, test_rows, train_rows, train_size_warnings
from splitleak.integrity import check_integrity
from splitleak.models import InputSpec, build_bottom, build_top, input_spec
from splitleak.partition import label_party_columns, passive_columns
from splitleak.placement import check_devices
from splitleak.plugins import Artifact, plugin_groups
from splitleak.provenance import is_built_in
from splitleak.registry import UnknownPluginError
from splitleak.white_box import own_columns

# Protobuf framing and the small fields of a message, on top of its tensors' bytes.
MESSAGE_OVERHEAD = 16 << 10
# What a tap may hold in memory while its sidecar is slow (attacker.queue_size records): the
# default queue (64) of records as large as the default topology.max_message_mb (64) allows.
MAX_TAP_QUEUE_MB = 4096


@dataclass(frozen=True)
class Validated:
    """A config every role can run (its evaluation artifacts resolved), and what is allowed but
    probably a mistake."""

    cfg: ExperimentConfig
    warnings: list[str]


def validate(cfg: ExperimentConfig, read_values: bool = False) -> Validated:
    """Everything that can be checked before a process starts; ConfigError names the field.
    `read_values`: also parse every value of the data files (`splitleak validate`; a run's
    parties do it anyway while loading)."""
    schema = check_core(cfg)
    check_devices(cfg)
    needs: set[Artifact] = set()
    warnings = overlap_warnings(cfg, schema) + ignored_warnings(cfg)
    for group in plugin_groups():
        group.check(cfg, schema)
        needs |= group.artifacts(cfg, schema)
        warnings += group.warnings(cfg, schema)
    if schema.num_rows:  # counted without reading the data: the run warns too
        warnings += train_size_warnings(cfg, schema.num_rows)
    if read_values:
        warnings += check_data_values(cfg, counted=bool(schema.num_rows))
    resolved = cfg.model_copy(update={"evaluation": resolve_evaluation(cfg, needs)})
    return Validated(resolved, warnings)


def validated(cfg: ExperimentConfig) -> ExperimentConfig:
    """The config validate() resolves (a sweep's point: every one is checked)."""
    return validate(cfg).cfg


def resolved(cfg: ExperimentConfig) -> ExperimentConfig:
    """`cfg` itself when a CLI's validation already resolved it, else validated now (a config
    built in code, e.g. a test's)."""
    return cfg if cfg.evaluation.resolved else validated(cfg)


def resolve_evaluation(cfg: ExperimentConfig, needs: set[Artifact]) -> EvaluationConfig:
    """[evaluation] with every field filled: what the plug-ins need and the threat model
    implies. A given clean_anchors must name tapped parties; the other two follow the threat
    model and may only repeat it (a run directory's config.toml does)."""
    given = cfg.evaluation
    tapped = cfg.tapped_parties
    anchors = tapped if "clean_anchors" in needs else []
    if given.clean_anchors is not None:
        strangers = sorted(set(given.clean_anchors) - set(tapped))
        if strangers:
            raise ConfigError(f"evaluation.clean_anchors names {strangers}, which are not tapped; "
                              f"allowed: a subset of the tapped parties {tapped}")
        anchors = sorted(set(given.clean_anchors))
    implied = {"white_box_snapshots": cfg.threat.white_box_parties,
               "received_activations": cfg.received_parties}
    for name, value in implied.items():
        stated = getattr(given, name)
        if stated is not None and sorted(stated) != value:
            raise ConfigError(f"evaluation.{name} = {stated} disagrees with the threat model, "
                              f"which implies {value}; leave it out (it is resolved)")
    return EvaluationConfig(clean_anchors=anchors, **implied)


def check_core(cfg: ExperimentConfig) -> Schema:
    """Dataset name and params, column ranges, loss, models and message sizes; returns the
    dataset's layout (its schema without a row count where counting costs a pass over the data:
    nothing checked here depends on it, and every role validates at start)."""
    try:
        cls = DATASETS.get(cfg.dataset.name)
    except UnknownPluginError as err:
        raise ConfigError(f"dataset.name: {err}") from None
    try:
        params = cls.Params.model_validate(cfg.dataset.params)
    except ValidationError as err:
        raise ConfigError(plugin_param_errors("dataset.params", err, cls.Params)) from None
    try:
        schema = cls(params).layout()
    except DatasetError as err:
        raise ConfigError(f"dataset: {err}") from None
    columns = passive_columns(cfg, schema)
    own = label_party_columns(cfg, schema)
    cfg.loss_for(schema.num_classes)
    check_models(cfg, schema, columns, own)
    if cfg.threat.white_box_parties:
        own_columns(cfg, schema)  # the private features name categorical columns of the slice
    check_integrity(cfg, schema)
    return schema


def check_data_values(cfg: ExperimentConfig, counted: bool = False) -> list[str]:
    """Every value of the dataset's files parses (a pass over them, streaming: bounded memory),
    and the labels pass the label party's class checks; ConfigError names the file, line and
    column of the first bad one. Returns warnings on the classes present, and on the train
    split's size unless the layout `counted` its rows (validate warned of it then)."""
    try:
        dataset = build_dataset(cfg.dataset.name, cfg.dataset.params)
        dataset.check_values()
        labels = dataset.labels()
        layout = dataset.layout()
        check_against_schema(dataset, layout, labels=labels)
        if not is_built_in(type(dataset)):
            check_installed_dataset(cfg, dataset, labels, layout)
        warnings = check_classes(cfg, labels, split_ids(cfg, labels.size)[1], layout.num_classes)
        return warnings + ([] if counted else train_size_warnings(cfg, labels.size))
    except DatasetError as err:
        raise ConfigError(f"dataset: {err}") from None


def check_installed_dataset(cfg: ExperimentConfig, dataset: Dataset, labels: np.ndarray,
                            layout: Schema) -> None:
    """What the roles will ask of an installed dataset (the built-ins' tests ask it of theirs):
    each party's features, and the same answers from a second instance built from the same
    params, as every role builds its own. DatasetError naming the dataset."""
    def differ(asked: str) -> DatasetError:
        return DatasetError(f"{origin(type(dataset))}: two instances built from the same params "
                            f"return different {asked}; every role builds its own, so a dataset "
                            "must give the same rows in the same order for the same params "
                            "(draw from a generator seeded by a parameter)")

    again = build_dataset(cfg.dataset.name, cfg.dataset.params)
    if not np.array_equal(again.labels(), labels):
        raise differ("labels()")
    own = label_party_columns(cfg, layout)
    for columns in [*passive_columns(cfg, layout).values(), *([own] if own else [])]:
        first, second = dataset.features(columns), again.features(columns)
        check_against_schema(dataset, layout, features=first)
        if not (np.array_equal(first.numeric, second.numeric, equal_nan=True)
                and np.array_equal(first.categorical, second.categorical)):
            raise differ(f"features({columns})")


def check_models(cfg: ExperimentConfig, schema: Schema, columns: dict[int, tuple[int, int]],
                 own: tuple[int, int] | None) -> None:
    """Build every party's model once on a zero row: shapes that cannot fit fail here, and so
    do messages that could not cross the wire within topology.max_message_mb."""
    width = cfg.output_width(schema.num_classes)
    sized = _wide(cfg)  # sized on the meta device first (its first use costs a second of imports)
    try:
        if sized:
            with torch.device("meta"):  # sizes only: nothing allocated
                weights = sum(_bytes(build_bottom(cfg.model, input_spec(schema, cols), width, seed=0))
                              for cols in columns.values())
            _check_fits(weights)
        bottoms = {k: bottom_shapes(cfg, schema, cols) for k, cols in columns.items()}
        shapes = [shape for shape, _ in bottoms.values()]
        own_spec = input_spec(schema, own) if own else None
        if sized:
            with torch.device("meta"):
                weights += _bytes(build_top(cfg.model, shapes, own_spec, width, seed=0))
            _check_fits(weights)
        build_top(cfg.model, shapes, own_spec, width, seed=0)
    except (ValueError, RuntimeError, MemoryError) as err:
        raise ConfigError(f"model: {_allocation(err) or err}") from None
    check_message_sizes(cfg, bottoms)
    check_link_time(cfg, bottoms, schema.num_rows)


# Training holds each weight four times: the weight, its gradient and Adam's two moments.
TRAINING_COPIES = 4
# Below these no model of the built-in kinds comes near a machine's memory: not sized first.
SMALL_WIDTH, SMALL_EMBEDDING = 4096, 256


def _wide(cfg: ExperimentConfig) -> bool:
    """Layers or embeddings wide enough that the models are sized before they are built."""
    widest = max([*cfg.model.layers, *cfg.model.channels], default=0)
    return widest > SMALL_WIDTH or cfg.model.embedding_dim > SMALL_EMBEDDING


def _bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _check_fits(weights: int) -> None:
    """ConfigError when training the run's models (every party on this machine) needs more
    memory than the machine has available."""
    available = available_memory()
    needed = TRAINING_COPIES * weights
    if available is not None and needed > available:
        raise ConfigError(f"its weights take {weights / 2**30:.1f} GiB, about "
                          f"{needed / 2**30:.1f} GiB to train (with gradients and optimizer "
                          f"state), and this machine has {available / 2**30:.1f} GiB available; "
                          "give smaller model.layers, model.channels or model.embedding_dim")


def available_memory() -> int | None:
    """Bytes of memory available to new work (Linux's MemAvailable); None where unknown."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


_ASKED = re.compile(r"tried to allocate (\d+) bytes")


def _allocation(err: BaseException) -> str | None:
    """torch's allocator failure in one sentence (None for any other error)."""
    asked = _ASKED.search(str(err))
    if asked is None and not isinstance(err, MemoryError):
        return None
    size = f" ({int(asked.group(1)) / 2**30:.1f} GiB for one tensor)" if asked else ""
    return (f"its weights do not fit in this machine's memory{size}; give smaller "
            "model.layers, model.channels or model.embedding_dim")


def bottom_shapes(cfg: ExperimentConfig, schema: Schema,
                  columns: tuple[int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(activation shape, first layer's output shape) of one example through the bottom
    model the shared config gives a party holding `columns`."""
    spec = input_spec(schema, columns)
    bottom = build_bottom(cfg.model, spec, cfg.output_width(schema.num_classes), seed=0).eval()
    first = next(m for m in bottom.modules() if isinstance(m, nn.Linear | nn.Conv2d))
    seen: list[tuple[int, ...]] = []
    hook = first.register_forward_hook(lambda m, a, out: seen.append(tuple(out.shape[1:])))
    with torch.no_grad():
        shape = tuple(bottom(*_zero_row(spec)).shape[1:])
    hook.remove()
    return shape, seen[0]


def expected_embedding_shapes(cfg: ExperimentConfig, schema: Schema) -> dict[int, tuple[int, ...]]:
    """Passive party id -> the activation shape (without the batch dimension) its Join must
    announce: what the shared config implies for that party's bottom model."""
    return {k: bottom_shapes(cfg, schema, cols)[0]
            for k, cols in passive_columns(cfg, schema).items()}


def check_message_sizes(cfg: ExperimentConfig,
                        bottoms: dict[int, tuple[tuple[int, ...], tuple[int, ...]]]) -> None:
    """Every message of a full batch fits topology.max_message_mb: activations up, cut
    gradients plus the next batch's ids down, and the tap's records to the sidecar."""
    limit = cfg.topology.max_message_mb << 20
    rows = cfg.training.batch_size
    observed, received = set(cfg.tapped_parties), set(cfg.received_parties)
    queues: list[tuple[int, str, int]] = []  # (party, which side taps it, one record's bytes)
    for k, (shape, first) in sorted(bottoms.items()):
        activation = rows * math.prod(shape) * 4
        sizes = {"activation": activation, "cut gradient": activation + rows * 8}
        if k in observed:
            record = activation + rows * 8
            record += activation if cfg.attacker.record_activation else 0
            record += rows * math.prod(first) * 4 if cfg.attacker.record_first_layer else 0
            sizes["gradient record to the sidecar"] = record
            queues.append((k, "passive party", record))
        if k in received:  # the label party's tap: the activation it received, and the ids
            queues.append((k, "label party", activation + rows * 8))
        what, size = max(sizes.items(), key=lambda item: item[1])
        if size + MESSAGE_OVERHEAD > limit:
            needed = math.ceil((size + MESSAGE_OVERHEAD) / (1 << 20))
            raise ConfigError(
                f"topology.max_message_mb = {cfg.topology.max_message_mb}: passive party {k}'s "
                f"{what} for a batch of {rows} rows takes {size / (1 << 20):.1f} MiB; raise "
                f"max_message_mb to at least {needed} or lower training.batch_size")
    for k, side, record in queues:
        check_tap_queue(cfg, k, side, record)


def check_tap_queue(cfg: ExperimentConfig, k: int, side: str, record: int) -> None:
    """A tap holds up to attacker.queue_size records while its sidecar is slow: at most
    MAX_TAP_QUEUE_MB of memory in the tapping party, whatever the batch."""
    held = cfg.attacker.queue_size * record
    if held > MAX_TAP_QUEUE_MB << 20:
        largest = max(1, (MAX_TAP_QUEUE_MB << 20) // record)
        raise ConfigError(
            f"attacker.queue_size = {cfg.attacker.queue_size}: the {side}'s tap of passive party "
            f"{k} would hold up to {held / (1 << 20):.0f} MiB ({cfg.attacker.queue_size} records "
            f"of {record / (1 << 20):.1f} MiB for a batch of training.batch_size = "
            f"{cfg.training.batch_size} rows) while the sidecar is slow; at most "
            f"{MAX_TAP_QUEUE_MB} MiB: lower attacker.queue_size to at most {largest} or lower "
            "training.batch_size")


def check_link_time(cfg: ExperimentConfig,
                    bottoms: dict[int, tuple[tuple[int, ...], tuple[int, ...]]],
                    num_rows: int | None) -> None:
    """On an emulated link ([network] bandwidth_mbit) every exchange, plus the round trip, must
    cross within topology.step_deadline_s, or every step (or every evaluation) times out: a
    full train batch's activation up and cut gradient down (with the next batch, where no
    evaluation or checkpoint in between carries it), and an evaluation batch's activation up
    with the last train step's cut gradient down (an evaluation batch has training.batch_size
    rows of the test split, more than a train batch where the test split is the larger). A
    lower bound, so skipped where the bytes are not known before the run (gzip / deflate, the
    sparse wire) or the rows are not counted yet."""
    n, bandwidth = cfg.network, cfg.network.bandwidth_mbit
    if not bandwidth or cfg.wire.compression != "none" or cfg.wire.sparse or num_rows is None:
        return
    train = train_rows(cfg, num_rows)
    rows = min(cfg.training.batch_size, train)
    # an evaluation sends the test split first, its first batch with the last cut gradient;
    # the train split's batches (training.eval_train) travel alone, no larger than a train step's
    scored = min(cfg.training.batch_size, test_rows(cfg, num_rows))
    ways = 2 if gradient_rides_a_train_batch(cfg, train) else 1
    width = 2 if cfg.wire.dtype in ("float16", "bfloat16") else 4
    deadline = cfg.topology.step_deadline_s

    def seconds(nbytes: int) -> float:
        return 2 * n.one_way_latency_ms / 1e3 + nbytes * 8 / (bandwidth * 1e6)

    for k, (shape, _) in sorted(bottoms.items()):
        tensor = rows * math.prod(shape) * width  # the activation, and its gradient back
        evaluated = scored * math.prod(shape) * width
        if (took := seconds(ways * tensor)) >= deadline:
            what = ("activation and cut gradient", "take", " each way") if ways == 2 else (
                "activation", "takes", "")
            said = (f"{what[0]} for a batch of {rows} rows ({tensor / (1 << 10):.0f} KiB{what[2]}) "
                    f"{what[1]} at least {took:.3g} s per train step")
            during = "step"
        elif (took := seconds(tensor + evaluated)) >= deadline:
            said = (f"activation for an evaluation batch of {scored} rows "
                    f"({evaluated / (1 << 10):.0f} KiB), with the last train step's cut gradient "
                    f"({tensor / (1 << 10):.0f} KiB), takes at least {took:.3g} s")
            during = "evaluation"
        else:
            continue
        raise ConfigError(
            f"network.bandwidth_mbit = {bandwidth:g}: passive party {k}'s {said} over the "
            f"link, at or over topology.step_deadline_s = {deadline:g}, so every {during} "
            "would time out; raise the bandwidth or the step deadline, or lower "
            "training.batch_size")


def gradient_rides_a_train_batch(cfg: ExperimentConfig, train: int) -> bool:
    """Does some train batch carry the previous step's cut gradient? A step's gradient goes
    out with the next train batch unless an evaluation pass or a periodic checkpoint between
    the two takes it first (label_party/driver.py): never in a one-step run, nor where one of
    them follows every step (training.eval_interval = 1, one batch per epoch and no
    eval_interval, or training.checkpoint_every = 1)."""
    t = cfg.training
    per_epoch = -(-train // t.batch_size)
    steps = min(per_epoch * t.epochs, t.max_steps or per_epoch * t.epochs)
    return steps >= 2 and (t.eval_interval or per_epoch) != 1 and t.checkpoint_every != 1


def ignored_warnings(cfg: ExperimentConfig) -> list[str]:
    """Settings the run will not use, as written (allowed, but probably not what was meant)."""
    warnings = []
    if not cfg.attacker.enabled and cfg.attacker.attacks:
        warnings.append("attacker.attacks is not used: attacker.enabled = false (no sidecar "
                        "records and nothing is analysed)")
    return warnings


def overlap_warnings(cfg: ExperimentConfig, schema: Schema | None = None) -> list[str]:
    """Passive parties holding the same columns (unless features.allow_overlap says so).
    Without `schema` (the analysis of a run, which may lack its data): explicit column ranges
    as written; ratios never overlap."""
    if cfg.features.allow_overlap:
        return []
    if schema is not None:
        columns = passive_columns(cfg, schema)
    elif cfg.features.passive is not None:
        columns = {k + 1: (r[0], r[1]) for k, r in enumerate(cfg.features.passive)}
    else:
        return []
    warnings = []
    for (a, (a0, a1)), (b, (b0, b1)) in combinations(sorted(columns.items()), 2):
        if max(a0, b0) < min(a1, b1):
            warnings.append(f"features.passive: passive parties {a} and {b} both hold columns "
                            f"[{max(a0, b0)}, {min(a1, b1)}); set features.allow_overlap = true "
                            "if they are meant to share them")
    return warnings


def _zero_row(spec: InputSpec) -> tuple[torch.Tensor, torch.Tensor]:
    if spec.image_shape is not None:
        return torch.zeros(1, *spec.image_shape), torch.zeros(1, 0, dtype=torch.int64)
    return (torch.zeros(1, spec.num_numeric),
            torch.zeros(1, len(spec.cardinalities), dtype=torch.int64))
