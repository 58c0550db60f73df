"""Sweeps: a grid of ordinary experiments (variants x axes x seeds) run on an engine, resumable."""
