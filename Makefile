# tengen: `make run` and `make test` do all the set-up on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: setup run test bench lint format docs clean-cache clean

setup: $(STAMP)

# Reinstalls when the dependencies change; torch stays pinned by constraints.txt.
# pip's own output goes to a log, shown only when the install fails.
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing tengen and its dependencies into $(VENV) (log: $(VENV)/install.log)"
	@{ $(BIN)/python -m pip install --upgrade pip && \
	   $(BIN)/python -m pip install -c constraints.txt -e '.[dev,bench]'; } \
	   > $(VENV)/install.log 2>&1 || \
	 { tail -n 30 $(VENV)/install.log; echo "make: the install failed: $(VENV)/install.log"; exit 1; }
	@touch $@

# Trains a 9x9 net from zero for params.yaml's few generations (run.generations), here in the
# source tree: Prefect's local API, MLflow in mlflow.db, DVC's cache; no server to start.
# `make run PRESET=long` makes runs/long from flows/presets/long.yaml and runs that instead.
# First the programs the evaluations play (GNU Go), installed where this user can; where it
# cannot, the run names them before its first stage and evaluates without them.
PRESET ?=
run: setup
	@$(BIN)/tengen check --install --quiet $(if $(PRESET),--preset $(PRESET)) || true
	$(BIN)/tengen run $(if $(PRESET),--preset $(PRESET))

test: $(TEST_STAMP)
	$(BIN)/python -m pytest

# The tests also drive KaTrain's own engine classes (tests/test_katrain.py): KaTrain and its
# Kivy, which `make run` does not need.
$(TEST_STAMP): $(STAMP)
	@echo "installing KaTrain for its tests into $(VENV) (log: $(VENV)/install.log)"
	@$(BIN)/python -m pip install -c constraints.txt -e '.[dev,bench,katrain]' \
	   >> $(VENV)/install.log 2>&1 || \
	 { tail -n 30 $(VENV)/install.log; echo "make: the install failed: $(VENV)/install.log"; exit 1; }
	@touch $@

bench: setup
	$(BIN)/tengen bench rules
	$(BIN)/tengen bench features
	$(BIN)/tengen bench nets
	$(BIN)/tengen bench selfplay
	$(BIN)/tengen bench threads
	$(BIN)/tengen bench play
	$(BIN)/tengen bench shuffle
	$(BIN)/tengen bench scale

# The documentation site (MkDocs over docs/, the CLI reference made from the typer app), served
# with live reload on http://127.0.0.1:8000.
docs: setup
	$(BIN)/mkdocs serve

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
