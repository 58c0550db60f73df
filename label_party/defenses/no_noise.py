"""The identity defense: the cut gradient is sent as computed."""

from __future__ import annotations

import torch

from label_party.defenses.base import DEFENSES, Defense, DefenseContext


@DEFENSES.register("no_noise")
class NoNoise(Defense):
    """g̃ = g (returns the input tensor itself)."""

    name = "no_noise"

    def __call__(self, cut_gradient: torch.Tensor, ctx: DefenseContext) -> torch.Tensor:
        return cut_gradient
