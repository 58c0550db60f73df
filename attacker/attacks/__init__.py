"""Every attack plug-in, one module each; importing this registers them all. The batch attacks
on received gradients sit here; each family of run-level attacks has a folder of its own with
its engine and its report section: completion/, reconstruction/, exact/, integrity/."""

from __future__ import annotations

from typing import Any

from attacker.attacks import (  # noqa: F401  (imported to register)
    batch_label_counts,
    clustering,
    cosine_majority,
    cosine_oracle,
    direct_label,
    hint_distance,
    hint_inner,
    mean,
    median,
    norm,
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
from attacker.attacks.completion import model_completion  # noqa: F401
from attacker.attacks.exact import exact  # noqa: F401
from attacker.attacks.integrity import (  # noqa: F401
    missing_features,
    noisy_samples,
    replacement_backdoor,
)
from attacker.attacks.reconstruction import back_mapping, cafe, grn, inversion  # noqa: F401

# Run on every binary run, in this order.
DEFAULT_ATTACKS: list[tuple[str, dict[str, Any]]] = [
    ("norm", {}),
    ("cosine_oracle", {}),
    ("cosine_majority", {}),
    *[("hint_distance", {"k": k}) for k in (1, 3, 5)],
    *[("hint_inner", {"k": k}) for k in (1, 3, 5)],
    ("mean", {"centers": "oracle"}),
    ("mean", {"centers": "oracle_loo"}),
    ("mean", {"centers": "hint"}),
    ("median", {"centers": "oracle"}),
    ("median", {"centers": "oracle_loo"}),
    ("median", {"centers": "hint"}),
    ("clustering", {}),
]

# k known positives per batch: the threat model's hints (a k named in the attack's params wins).
HINT_ATTACKS = ("hint_distance", "hint_inner")

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
    "HINT_ATTACKS",
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
