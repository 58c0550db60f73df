"""The input-protection plug-in interface: a party replaces its own train images once, before
training, by protected ones (ALGORITHMS.md §5)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from splitleak.registry import Registry
from splitleak.settings import Settings


class ProtectionFailed(Exception):
    """A protection that could not protect the party's images (e.g. its training diverged): the
    party stops, saying this sentence, before it joins."""


class ProtectionParams(Settings):
    """Base of every protection's parameter model (the config's `[protection] params`)."""


@dataclass(frozen=True)
class Protected:
    """The images the party trains on instead of its real ones, and the figures for the report."""

    images: torch.Tensor
    figures: dict[str, Any]


class Protection(ABC):
    name: ClassVar[str]
    Params: ClassVar[type[ProtectionParams]] = ProtectionParams

    def __init__(self, params: ProtectionParams) -> None:
        self.params = params

    def check_images(self, image_shape: tuple[int, int, int]) -> str | None:
        """Why the protection cannot run on a party's images of `image_shape` (C, H, W), naming
        the parameter (validate refuses the config with it); None: it can."""
        return None

    @abstractmethod
    def __call__(self, images: torch.Tensor, first_block: nn.Module, seed: int) -> Protected:
        """Protect `images` ([n, C, H, W], the party's train rows); `first_block` is the party's
        bottom model's first conv block (a copy may be trained; the party's own is untouched)."""


PROTECTIONS: Registry[type[Protection]] = Registry("protection", Protection)


def build_protection(name: str, params: dict[str, Any]) -> Protection:
    cls = PROTECTIONS.get(name)
    return cls(cls.Params.model_validate(params))
