"""Orchestration: the layer above the roles that composes them (run, reference, sweep, compare, bench)."""
