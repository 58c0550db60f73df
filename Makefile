# Quick start: `make run` trains the built-in default; `make test` runs the tests.
# Both create ./.venv and install the project with the pinned dependencies first.

PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
STAMP = $(VENV)/.installed

.PHONY: setup run test test-slow lint bench protos clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,dev]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/splitleak run

# The README's test command (≤ 10 min): everything but the multi-process end-to-end runs.
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not containers"

# What CI adds: end-to-end runs, faults, soak, sweeps, the Ray cluster (tens of minutes).
test-slow: $(STAMP)
	$(BIN)/python -m pytest -m "slow and not containers" --durations=20

# mypy checks the packages [tool.mypy] names: ~40 s cold (a clean clone, CI), ~1 s with its cache.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/splitleak bench

protos: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

clean:
	rm -rf $(VENV) build *.egg-info
