"""What the analysis reads of a run directory: its config, labels, metrics and outcome, each
refused with AnalysisInputError naming the file when it cannot be read."""

from __future__ import annotations

import tomllib
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import ValidationError

from splitleak.artifacts.metrics import MetricsError
from splitleak.artifacts.metrics_log import MetricsLog, read_metrics_log
from splitleak.artifacts.outcome import OutcomeError, read_outcome_or_refuse
from splitleak.artifacts.paths import RunDir
from splitleak.artifacts.records import read_tap_reports
from splitleak.config import AttackerConfig, plugin_param_errors
from splitleak.threat import ThreatConfig


class AnalysisInputError(ValueError):
    """The directory is not an analysable run (missing, not a run, unreadable inputs)."""


def read_labels(run: RunDir) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(label by sample id, train ids, test ids) from the label party's evaluation export."""
    if not run.labels.exists():
        raise FileNotFoundError(f"no label export at {run.labels}: the label party writes it "
                                "when training starts (did the run start?)")
    try:
        names = pq.read_schema(run.labels).names
        table = pq.read_table(run.labels,
                              columns=[c for c in ("sample_id", "label", "split") if c in names])
        ids = table.column("sample_id").to_numpy()
        labels = table.column("label").to_numpy()
    except (pa.ArrowException, OSError, KeyError) as err:
        raise AnalysisInputError(f"{run.labels} is not a readable label export: {err}") from None
    if ids.size == 0:
        raise AnalysisInputError(f"{run.labels} holds no labels")
    if ids.min() < 0 or labels.min() < 0:
        raise AnalysisInputError(f"{run.labels} holds negative sample ids or labels")
    lookup = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
    lookup[ids] = labels
    split = (table.column("split").to_numpy(zero_copy_only=False) if "split" in names
             else np.full(ids.size, "train"))
    return lookup, np.sort(ids[split == "train"]), np.sort(ids[split == "test"])


def read_run_config(run: RunDir) -> dict[str, Any]:
    try:
        config = tomllib.loads(run.config.read_text()) if run.config.exists() else {}
    except (OSError, ValueError) as err:
        raise AnalysisInputError(f"{run.config} is not a readable experiment config: {err}") from None
    if run.config.exists() and not config:
        raise AnalysisInputError(f"{run.config} is empty: the analysis needs the experiment the run "
                                 "trained (its seed and [threat]), as the run wrote it")
    return config


def read_records(run: RunDir) -> MetricsLog:
    """The run's metrics, read once into per-step arrays (empty when it wrote none);
    AnalysisInputError naming the line."""
    try:
        return read_metrics_log(run.metrics)
    except MetricsError as err:
        raise AnalysisInputError(str(err)) from None


def read_run_outcome(run: RunDir) -> dict[str, Any]:
    """How the run ended ({} when it has no outcome.json); AnalysisInputError when unreadable."""
    try:
        return read_outcome_or_refuse(run)
    except OutcomeError as err:
        raise AnalysisInputError(str(err)) from None


def config_warnings(config: dict[str, Any], num_classes: int,
                    specs: list[tuple[str, dict]] | None = None, hints: list[int] | None = None,
                    field: str = "attacker.attacks") -> list[str]:
    """What is allowed in the run's config but probably a mistake (the warnings `splitleak
    validate` and the parties log), for the report: e.g. parties sharing columns; the hint
    warnings for the attacks that run (`specs`, named in `field`; None: the config's) with
    `hints` (--hints; None: the threat model's)."""
    from attacker.attacks.checks import capped_hints, unscorable_hints
    from splitleak.config import ConfigError, parse_config
    from splitleak.validation import ignored_warnings, overlap_warnings

    try:
        cfg = parse_config(config, "the run's config")
    except ConfigError:
        return []
    return (overlap_warnings(cfg) + ignored_warnings(cfg)
            + unscorable_hints(cfg, num_classes, specs, hints, field)
            + capped_hints(cfg, specs, field))


def configured_attacks(config: dict[str, Any]) -> list[tuple[str, dict]] | None:
    """The run's own `attacker.attacks` (None: every default attack for its task)."""
    try:
        listed = AttackerConfig.model_validate(config.get("attacker") or {}).attacks
    except ValidationError as err:
        raise AnalysisInputError("the run's config has an invalid [attacker] table: "
                                 f"{plugin_param_errors('attacker', err)}") from None
    return [(spec.name, spec.params) for spec in listed] or None


def seed_of(config: dict[str, Any], run: RunDir) -> int:
    try:
        return int(config.get("run", {}).get("seed", 0))
    except (ValueError, TypeError, AttributeError) as err:
        raise AnalysisInputError(f"{run.config}: run.seed is not an integer: {err}") from None


def check_run_dir(run: RunDir) -> None:
    if not run.root.is_dir():
        raise AnalysisInputError(f"{run.root} does not exist or is not a directory")
    if not run.config.is_file():
        raise AnalysisInputError(f"{run.root} is not a run directory (it has no {run.config.name})")


def partial_run(run: RunDir, metrics: MetricsLog) -> dict[str, Any] | None:
    """How far a run that did not finish got (None for a finished run), from its `metrics`."""
    outcome = read_run_outcome(run) or {
        "status": f"unknown (no {run.outcome.relative_to(run.root)}: still running, or killed)"}
    if outcome.get("status") == "ok":
        return None
    return {"status": outcome.get("status"), "step": outcome.get("step"),
            "message": outcome.get("message"), "train_steps_done": metrics.train_steps,
            "train_steps_planned": metrics.plan.get("total_train_steps")}


def cut_short(run: RunDir, metrics: MetricsLog, logged_last: int | None) -> dict[str, Any] | None:
    """A finished run whose metrics.jsonl ends before the run did (the file cut short: torn, or
    copied before the end), as a partial run whose `message` says why; None when they agree.
    `logged_last`: the last step in the gradient log (None: none read)."""
    outcome = read_run_outcome(run)
    if outcome.get("status") != "ok":
        return None
    last = int(metrics.steps.max()) if metrics.steps.size else -1
    ran = outcome.get("train_steps")
    ends = [f"{run.outcome.relative_to(run.root)} says the run ended ok after {ran} train steps"] \
        if isinstance(ran, int) and ran > last + 1 else []
    if logged_last is not None and logged_last > last:
        ends.append(f"the gradient log holds batches up to step {logged_last}")
    if not ends:
        return None
    return {"status": "ok", "step": None, "train_steps_done": metrics.train_steps,
            "train_steps_planned": ran if isinstance(ran, int) else metrics.plan.get("total_train_steps"),
            "message": f"{run.metrics} ends at train step {last}, but {' and '.join(ends)}: the file "
                       "was cut short (torn, or copied before the run ended?), so its last evaluation "
                       "is not the final one; the run is analysed as partial"}


def threat_of(config: dict[str, Any], run: RunDir) -> ThreatConfig:
    """The run's threat model; a file from before `[threat]` reads as the default (party 1)."""
    try:
        return ThreatConfig.model_validate(config.get("threat") or {})
    except ValidationError as err:
        raise AnalysisInputError(f"{run.config}: invalid [threat] section: "
                                 f"{plugin_param_errors('threat', err)}") from None


def set_up(config: dict[str, Any]) -> tuple[bool, bool]:
    """(the label party has a top model, the received gradients differ from the clean ones):
    a defense chain other than no_noise, or a wire narrower than float32, changes them."""
    model, wire = config.get("model") or {}, config.get("wire") or {}
    chain = [d.get("name") for d in config.get("defense") or [] if isinstance(d, dict)]
    perturbed = any(name != "no_noise" for name in chain) or wire.get("dtype", "float32") != "float32"
    return model.get("top", "mlp") != "none", perturbed


def recording_gaps(run: RunDir) -> list[str]:
    """A warning per tapped party whose sidecar missed records and the run went on
    (attacker.on_sidecar_failure = "continue"), from the party's tap.json."""
    return [f"party {k}: the sidecar did not record {tap.gap_records} of its gradient records, "
            f"from step {tap.gap_first_step} on ({tap.error}); the run went on "
            f'(attacker.on_sidecar_failure = "continue"), so the leak figures of party {k} cover '
            "only the batches recorded"
            for k, tap in read_tap_reports(run).items() if tap.gap_records]
