# tengen: `make run` and `make test` do all the set-up on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test bench lint format clean-cache clean

setup: $(STAMP)

# Reinstalls when the dependencies change; torch stays pinned by constraints.txt.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,bench]'
	touch $@

# Trains a 9x9 net from zero for params.yaml's few generations (run.generations), here in the
# source tree: Prefect's local API, MLflow in mlflow.db, DVC's cache; no server to start.
# `make run PRESET=long` makes runs/long from flows/presets/long.yaml and runs that instead.
PRESET ?=
run: setup
	$(BIN)/tengen run $(if $(PRESET),--preset $(PRESET))

test: setup
	$(BIN)/python -m pytest

bench: setup
	$(BIN)/tengen bench rules
	$(BIN)/tengen bench features
	$(BIN)/tengen bench nets
	$(BIN)/tengen bench selfplay
	$(BIN)/tengen bench threads
	$(BIN)/tengen bench play
	$(BIN)/tengen bench shuffle
	$(BIN)/tengen bench scale

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Compiled kernels live in ~/.cache/tengen/numba/gocore-<digest of gocore's sources>, so an
# edit never runs stale code; this removes the old folders too.
clean-cache:
	rm -rf "$${XDG_CACHE_HOME:-$$HOME/.cache}/tengen/numba"
	find gocore -name '*.nbi' -delete -o -name '*.nbc' -delete

clean: clean-cache
	rm -rf $(VENV) runs .pytest_cache .hypothesis
