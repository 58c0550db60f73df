"""Gradient defenses of the label party: every plug-in registered by importing this package."""

from label_party.defenses import (  # noqa: F401  (each module registers its defense)
    discrete_sgd,
    dp_gaussian,
    grad_perturb,
    iso,
    laplace,
    marvell,
    max_norm,
    no_noise,
    perp,
    ppdl,
    sparsify,
)
from label_party.defenses.base import DEFENSES, Defense, DefenseContext, build_defense
from label_party.defenses.chain import DefenseChain, chain_summaries

__all__ = ["DEFENSES", "Defense", "DefenseChain", "DefenseContext", "build_defense", "chain_summaries"]
