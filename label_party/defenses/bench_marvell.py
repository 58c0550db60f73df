"""Time one Marvell call (statistics + solver + noise) per batch on one CPU thread."""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from label_party.defenses.base import DefenseContext
from label_party.defenses.marvell import Marvell, MarvellParams

SHAPES = ((1024, 128), (128, 1600), (32768, 128))  # Criteo, ISIC, Avazu set-ups of Li et al.


def time_marvell(
    batch: int, dim: int, repeats: int, s: float = 4.0, seed: int = 0
) -> tuple[float, float]:
    """(median, min) wall time in ms of Marvell(s) on a synthetic two-class float32 batch."""
    data = torch.Generator().manual_seed(seed)
    labels = (torch.rand(batch, generator=data) < 0.25).long()  # 25 % positives
    direction = torch.randn(dim, generator=data)
    rows = torch.randn(batch, dim, generator=data) * 0.1
    rows += torch.where(labels.unsqueeze(1) == 1, -0.75, 0.25) * direction / dim**0.5
    defense = Marvell(MarvellParams(s=s))
    times = []
    for step in range(repeats + 2):  # two warm-up calls
        ctx = DefenseContext(
            labels=labels,
            party_id=1,
            epoch=0,
            step=step,
            num_classes=2,
            generator=torch.Generator().manual_seed(step),
        )
        start = time.perf_counter()
        defense(rows, ctx)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times[2:]), 1e3 * min(times[2:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per shape")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"marvell (s = 4, float32), median of {args.repeats}, {args.threads} thread(s)")
    for batch, dim in SHAPES:
        repeats = max(3, args.repeats // 10) if batch * dim > 1_000_000 else args.repeats
        median, fastest = time_marvell(batch, dim, repeats)
        print(f"  B={batch:6d} d={dim:5d}: {median:8.3f} ms per batch (min {fastest:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
