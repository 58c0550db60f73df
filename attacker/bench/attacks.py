"""Throughput of the default binary attacks (attack + leak AUC) on synthetic gradient batches."""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections.abc import Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from attacker.analysis.leak import attack_rng, evaluate_batch
from attacker.attacks import DEFAULT_ATTACKS, Attack, build_attack
from attacker.bench import MAX_BATCH, MAX_DIM, MAX_ROWS
from splitleak.arguments import float_in, int_in, seed


def synthetic_batch(
    rng: np.random.Generator, batch_size: int, dim: int, positive_rate: float
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients shaped like a logistic head's: (p - y) times a shared direction, plus noise."""
    labels = (rng.random(batch_size) < positive_rate).astype(np.int64)
    prob = rng.beta(2.0, 5.0, batch_size)
    direction = rng.standard_normal(dim)
    gradients = (prob - labels)[:, None] * direction + 0.1 * rng.standard_normal((batch_size, dim))
    return gradients.astype(np.float32), labels


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int_in(1, MAX_ROWS), default=1_000_000)
    parser.add_argument("--dim", type=int_in(1, MAX_DIM), default=128)
    parser.add_argument("--batch-size", type=int_in(1, MAX_BATCH), default=1024)
    parser.add_argument("--positive-rate", type=float_in(0.0, 1.0), default=0.25)
    parser.add_argument("--threads", type=int_in(1, 1024), default=1,
                        help="BLAS threads (1 = one core)")
    parser.add_argument("--seed", type=seed, default=0)
    args = parser.parse_args(argv)

    attacks = [build_attack(name, params) for name, params in DEFAULT_ATTACKS]
    # CPU seconds (what one core spends; robust to other load on the machine) and wall seconds.
    cpu = dict.fromkeys((attack.label for attack in attacks), 0.0)
    wall = dict.fromkeys((attack.label for attack in attacks), 0.0)
    data_rng = np.random.default_rng(args.seed)
    rows_done = 0
    with threadpool_limits(limits=args.threads):
        for step, start in enumerate(range(0, args.rows, args.batch_size)):
            size = min(args.batch_size, args.rows - start)
            gradients, labels = synthetic_batch(data_rng, size, args.dim, args.positive_rate)
            for attack in attacks:
                assert isinstance(attack, Attack)  # DEFAULT_ATTACKS are batch attacks
                rng = attack_rng(args.seed, step, 0, attack.label)
                began_cpu, began_wall = time.process_time(), time.perf_counter()
                evaluate_batch(attack, gradients, labels, rng)
                cpu[attack.label] += time.process_time() - began_cpu
                wall[attack.label] += time.perf_counter() - began_wall
            rows_done += size

    print(
        f"{rows_done} rows x d={args.dim}, batches of {args.batch_size}, "
        f"{args.threads} BLAS thread(s), seed {args.seed}"
    )
    print(f"  {'attack':<32} {'cpu s':>8} {'wall s':>8} {'rows/s (cpu)':>14}")
    rows = [*cpu.items(), ("all attacks", sum(cpu.values()))]
    wall["all attacks"] = sum(wall.values())
    for label, spent in rows:
        rate = rows_done / spent if spent > 0 else float("inf")
        print(f"  {label:<32} {spent:8.2f} {wall[label]:8.2f} {rate:14,.0f}")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"peak RSS {peak_mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
