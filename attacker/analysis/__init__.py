"""The offline analysis of a run: per-batch leak of every attack, the run-level attacks, the summary."""
