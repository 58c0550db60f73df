"""The attack plug-in interfaces: per-batch scores (or labels) from received gradients, and
run-level attacks that read what a party keeps after training (e.g. its bottom model)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch

from attacker.attacks.thresholds import MIN_MAX_HALF, ThresholdRule
from splitleak.config import ConfigError
from splitleak.provenance import blamed
from splitleak.registry import Registry
from splitleak.settings import Settings

if TYPE_CHECKING:
    from splitleak.artifacts.paths import RunDir
    from splitleak.config import ExperimentConfig

AttackKind = Literal["score", "label", "counts"]
NO_PREDICTION = -1  # a label attack's value for a row its rule makes no prediction on
# VFLAIR's attack types, which its T-DCS averages over (the value: its column, T-DCS_<value>).
Family = Literal["label_inference", "feature_reconstruction", "targeted_backdoor", "non_targeted"]
FAMILIES: dict[str, str] = {"label_inference": "LI", "feature_reconstruction": "FR",
                            "targeted_backdoor": "TB", "non_targeted": "NTB"}


class AttackParams(Settings):
    """Base of every attack's parameter model."""


class SideKnowledge:
    """The only way an attack learns anything about labels: what its threat model declares.

    Built per batch from the batch's true labels and a seeded generator; every index it
    hands out is marked as used, so the metric can exclude those rows from the AUC.
    """

    def __init__(self, labels: np.ndarray, rng: np.random.Generator, num_classes: int | None = None,
                 clean_anchor: tuple[int, np.ndarray] | None = None) -> None:
        self._labels = labels
        self._rng = rng
        self._clean_anchor = clean_anchor
        self.used = np.zeros(labels.shape[0], dtype=bool)
        # The task's class count is public (it fixes the model's output width), not a label.
        self.num_classes = num_classes or max(2, int(labels.max()) + 1 if labels.size else 2)

    def random_state(self) -> int:
        """A seed for the attack's own randomness (e.g. k-means' start), from the batch's stream."""
        return int(self._rng.integers(2**31 - 1))

    def clean_positive(self) -> tuple[int, np.ndarray | None] | None:
        """(row, clean gradient) of one positive the label party drew for this batch, with its
        gradient before any defense (the cosine oracle's side knowledge, Li et al. §3.3); the
        gradient is None when the run has no clean-anchor artifact (the caller then uses the
        received row). None when the batch has no positive."""
        if self._clean_anchor is not None:
            row, gradient = self._clean_anchor
            self.used[row] = True
            return row, gradient
        picked = self.known_positives(1)
        return (int(picked[0]), None) if picked.size else None

    def known_positives(self, k: int) -> np.ndarray:
        """Indices of up to k positive (class 1) rows, chosen at random."""
        positives = np.flatnonzero(self._labels == 1)
        chosen = self._rng.choice(positives, size=min(k, positives.size), replace=False)
        self.used[chosen] = True
        return np.sort(chosen)

    def known_labels(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """m rows chosen at random, with their labels."""
        n_rows = self._labels.shape[0]
        chosen = np.sort(self._rng.choice(n_rows, size=min(m, n_rows), replace=False))
        self.used[chosen] = True
        return chosen, self._labels[chosen]

    def class_labels_oracle(self) -> np.ndarray:
        """Every row's label (oracle threat model, e.g. GAFM's mean/median evaluation).

        Rows are not marked as used: the oracle variant is an upper bound, as in GAFM.
        """
        return self._labels


@dataclass(frozen=True)
class AttackResult:
    """Scores (kind "score": larger = more likely positive), labels (kind "label") or the
    batch's class counts (kind "counts"); `skip_reason` says why the batch cannot be attacked."""

    values: np.ndarray  # float64 [B] scores, int64 [B] inferred labels, or float64 [K] counts
    exclude: np.ndarray  # bool [B]: rows given as side knowledge, left out of the metric
    skip_reason: str | None = None
    # A score attack's own hard labels (0/1 [B]), when its rule is not a threshold on the scores
    # (clustering: the smaller cluster); used for the threshold accuracy in place of the rule.
    decisions: np.ndarray | None = None


class AttackPlugin(ABC):
    """What every attack declares: its name, parameters, side knowledge, and its VFLAIR family."""

    name: ClassVar[str]
    kind: ClassVar[Literal["score", "label", "counts", "run"]]
    side_knowledge: ClassVar[str]  # one line, printed next to every number
    family: ClassVar[Family]  # the attack type VFLAIR's T-DCS groups it under
    vflair: ClassVar[str | None] = None  # VFLAIR's name for it (NS, DS, DLI, GRN, LRB, ...), if any
    Params: ClassVar[type[AttackParams]] = AttackParams
    needs_clean_anchors: ClassVar[bool] = False  # reads the label party's clean-anchor artifact

    def __init__(self, params: AttackParams) -> None:
        self.params = params

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        """The attack's own rules for a config it would run on; ConfigError naming the field.
        None by default: most attacks run on any config or skip a run with a reason."""
        return None

    @property
    def label(self) -> str:
        """Name plus parameters, as shown in tables (e.g. `hint_distance(k=3)`)."""
        args = ", ".join(f"{k}={v}" for k, v in self.params.model_dump().items())
        return f"{self.name}({args})" if args else self.name

    @property
    def randomised(self) -> bool:
        """Draws side knowledge at random, so the analysis repeats it over R seeded draws."""
        return False

    @classmethod
    def attack_performance(cls, entry: dict[str, Any]) -> dict[str, Any]:
        """VFLAIR's attack performance (AP, larger = the attack did better) read from this
        attack's summary entry: {"metric": how it is read, "value": the number or None}. A score
        attack's is the accuracy of its threshold rule, mean over batches (VFLAIR's label-
        recovery rate; ALGORITHMS.md §8); an entry analysed before the rule existed has only its
        flip-corrected AUC, given with its own name."""
        threshold = (entry.get("threshold_accuracy") or {}).get("mean")
        if threshold is not None:
            return {"metric": f"threshold accuracy ({entry.get('threshold_rule')})",
                    "value": threshold}
        if entry.get("flipped"):
            return {"metric": "mean flip-corrected AUC", "value": entry["flipped"].get("mean")}
        if entry.get("count_error"):
            error = entry["count_error"].get("mean")
            return {"metric": "1 - count error", "value": None if error is None else 1.0 - error}
        pooled = (entry.get("pooled") or {}).get("accuracy")
        return {"metric": "accuracy (pooled over rows)", "value": pooled}


@dataclass(frozen=True)
class RunFacts:
    """What an attacker knows of the run's set-up (the architecture and the protocol are
    public; the labels are not), for the attacks' premises."""

    top_model: bool  # the label party has a top model (model.top != "none")
    perturbed: bool  # a defense chain or a lossy wire changes the gradients the party receives
    colluding: bool  # a group's gradients side by side, not one party's


class Attack(AttackPlugin):
    """One label-inference attack on a batch of received cut-layer gradients."""

    kind: ClassVar[AttackKind] = "score"
    cut_layer_only: ClassVar[bool] = False  # reads logit gradients: no first-layer analysis
    # Also run on the activations the party sent, when recorded (attacker.record_activation).
    on_activations: ClassVar[bool] = False
    # Score attacks: how scores become labels for the threshold accuracy (VFLAIR's AP).
    threshold: ClassVar[ThresholdRule] = MIN_MAX_HALF

    def metric_kind(self, num_classes: int) -> AttackKind:
        """What the attack returns for a task with this many classes (its `kind` by default)."""
        return self.kind

    def applies_to(self, num_classes: int) -> bool:
        """Whether it scores a task with this many classes: a score ranks two classes, so a score
        attack has nothing to say on a multi-class run (the analysis leaves it out)."""
        return num_classes == 2 or self.metric_kind(num_classes) != "score"

    def premise(self, facts: RunFacts, layer: str) -> str | None:
        """Why the attack cannot apply to this run at `layer` (None: its premise holds). An
        attack whose premise fails is skipped with the sentence, never scored."""
        return None

    @property
    def per_epoch(self) -> bool:
        """True: attacked once per epoch, on all of the epoch's rows at once."""
        return False

    @property
    def sees_scored_label(self) -> bool:
        """True: a row's score reads that row's own label (an upper-bound variant), so no bound
        on what a gradient alone reveals, such as Marvell's Theorem 1, applies to it."""
        return False

    @abstractmethod
    def __call__(self, gradients: np.ndarray, side: SideKnowledge) -> AttackResult:
        """`gradients` is float32 [B, d] (multi-dimensional cut layers flattened). A label
        attack marks rows it makes no prediction on with NO_PREDICTION."""


def label_without_defaults(attack: AttackPlugin) -> str:
    """Name plus only the parameters that differ from their defaults, e.g. `clustering(scope=epoch)`."""
    changed = attack.params.model_dump(exclude_defaults=True)
    args = ", ".join(f"{k}={v}" for k, v in changed.items())
    return f"{attack.name}({args})" if args else attack.name


def _in_place(path: Path) -> Path:
    return path


@dataclass
class RunContext:
    """What a run-level attack may read: the run directory, the experiment file, the attacking
    parties, and labels only through `labelled_examples` (its declared side knowledge)."""

    run: RunDir
    cfg: ExperimentConfig
    parties: tuple[int, ...]  # one party, or a colluding group
    seed: int  # the parties' side-knowledge seed
    train_ids: np.ndarray
    test_ids: np.ndarray
    truth_by_id: np.ndarray  # labels.parquet (evaluation artifact): reach it only through
    # labelled_examples (side knowledge) and truth (scoring), never to train on
    labelled: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    device: torch.device = torch.device("cpu")  # where the attack trains its models
    written: Callable[[Path], Path] = _in_place  # where it writes the run's file (an
    # analysis's staging: swapped in with the leak files and summary once all are written)

    @property
    def num_classes(self) -> int:
        return max(2, int(self.truth_by_id.max()) + 1) if self.truth_by_id.size else 2

    def labelled_examples(self, per_class: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """`per_class` train rows of every class, drawn at random, with their labels; they are
        excluded from the reported train accuracy."""
        y = self.truth_by_id[self.train_ids]
        chosen = [rng.choice(self.train_ids[y == c], size=min(per_class, int((y == c).sum())),
                             replace=False) for c in range(self.num_classes) if (y == c).any()]
        self.labelled = np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)
        return self.labelled, self.truth_by_id[self.labelled]

    def truth(self, sample_ids: np.ndarray) -> np.ndarray:
        """Ground truth to score predictions against (never to train on)."""
        return self.truth_by_id[sample_ids]


class AttackRefused(ValueError):
    """The attack will not run with these settings (e.g. EXACT's enumeration above its cap):
    the analysis stops with the sentence rather than leaving a warning."""


@dataclass(frozen=True)
class RunResult:
    """A run-level attack's figures: `accuracy` is its headline (train top-1, pooled over rows),
    or the value of `metric` when it is not an accuracy (e.g. a reconstruction's SSIM)."""

    accuracy: float
    correct: int
    rows: int
    figures: dict[str, Any]
    metric: str = "accuracy"
    warnings: tuple[str, ...] = ()  # what makes its figures other than the settings say


class RunAttack(AttackPlugin):
    """An attack run once per attacking party (or colluding group) on what it kept."""

    kind: ClassVar[Literal["run"]] = "run"
    receiver: ClassVar[bool] = False  # the label party attacks the party's activations (§2.11)

    @property
    def diagnostic(self) -> str | None:
        """Why this variant's figure is a diagnostic rather than the one to set beside the
        papers' (None: it is that one)."""
        return None

    @abstractmethod
    def run(self, context: RunContext) -> RunResult:
        """Attack; raise ValueError with a sentence when the run lacks what it needs."""


ATTACKS: Registry[type[AttackPlugin]] = Registry("attack", AttackPlugin)


def build_attack(name: str, params: dict[str, Any]) -> AttackPlugin:
    """The attack `name` built from `params`; a ConfigError naming an attack of one's own whose
    __init__ raised."""
    cls = ATTACKS.get(name)
    valid = cls.Params.model_validate(params)
    with blamed("attack", name, cls, "__init__", ConfigError):
        return cls(valid)
