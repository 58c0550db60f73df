"""Benchmarks of the offline analysis (attacker bench): the leak metrics, model completion, EXACT."""

# The synthetic log's bounds: the largest, 10 M rows of d = 128, is about 5 GiB of gradients.
MAX_ROWS, MAX_DIM, MAX_BATCH = 10_000_000, 8192, 65_536
