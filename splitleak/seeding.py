"""Derived seeds: every random stream is a stable function of the run seed and a purpose."""

from __future__ import annotations

import zlib

import numpy as np
import torch


def derive_seed(seed: int, *purpose: str | int) -> int:
    """A 63-bit seed for one purpose (e.g. ("bottom", 2)), independent of call order."""
    words = [int(seed) & 0xFFFFFFFF, int(seed) >> 32]
    words += [zlib.crc32(str(p).encode()) for p in purpose]
    return int(np.random.SeedSequence(words).generate_state(2, np.uint64)[0] >> np.uint64(1))


def generator(seed: int, *purpose: str | int) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, *purpose))


def rng(seed: int, *purpose: str | int) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, *purpose))
