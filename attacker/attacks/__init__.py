"""Label-inference attacks on received cut-layer gradients; importing this registers them all."""

from __future__ import annotations

from typing import Any

from attacker.attacks import (  # noqa: F401  (imported to register)
    back_mapping,
    batch_label_counts,
    cafe,
    clustering,
    cosine_majority,
    cosine_oracle,
    direct_label,
    exact,
    grn,
    hint_distance,
    hint_inner,
    inversion,
    mean,
    median,
    missing_features,
    model_completion,
    noisy_samples,
    norm,
    replacement_backdoor,
)
from attacker.attacks.base import (
    ATTACKS,
    FAMILIES,
    NO_PREDICTION,
    Attack,
    AttackPlugin,
    AttackRefused,
    AttackResult,
    RunAttack,
    RunContext,
    RunResult,
    SideKnowledge,
    build_attack,
)

# Run on every binary run, in this order.
DEFAULT_ATTACKS: list[tuple[str, dict[str, Any]]] = [
    ("norm", {}),
    ("cosine_oracle", {}),
    ("cosine_majority", {}),
    *[("hint_distance", {"k": k}) for k in (1, 3, 5)],
    *[("hint_inner", {"k": k}) for k in (1, 3, 5)],
    ("mean", {"centers": "oracle"}),
    ("mean", {"centers": "hint"}),
    ("median", {"centers": "oracle"}),
    ("median", {"centers": "hint"}),
    ("clustering", {}),
]

# Run on every multi-class run.
DEFAULT_MULTICLASS_ATTACKS: list[tuple[str, dict[str, Any]]] = [
    ("direct_label", {}),
    ("batch_label_counts", {}),
    ("clustering", {}),
]

# Run once per attacking party whose threat entry declares labelled examples (labelled_per_class),
# EXACT once per party declared white_box, and the reconstruction attacks once per victim of the
# label party ([threat.receiver]), and each integrity attack once for the party declaring it.
RUN_ATTACKS: list[str] = ["model_completion", "exact", "inversion", "back_mapping", "grn", "cafe",
                          "replacement_backdoor", "noisy_samples", "missing_features"]

__all__ = [
    "ATTACKS",
    "FAMILIES",
    "DEFAULT_ATTACKS",
    "DEFAULT_MULTICLASS_ATTACKS",
    "NO_PREDICTION",
    "RUN_ATTACKS",
    "Attack",
    "AttackPlugin",
    "AttackRefused",
    "AttackResult",
    "RunAttack",
    "RunContext",
    "RunResult",
    "SideKnowledge",
    "build_attack",
]
