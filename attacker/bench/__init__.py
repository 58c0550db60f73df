"""Benchmarks of the offline analysis (attacker bench): the leak metrics, model completion, EXACT."""
