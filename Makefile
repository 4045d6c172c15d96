# Two entry points that do all their own set-up on a fresh machine:
#   make run   — create the virtualenv if needed, install corral, start `corral up`
#   make test  — the same set-up (plus the real omnigent server for tests/interop), then the
#                whole test suite
#   make test-fast — the same set-up, then all but the interop and chaos tests
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test test-fast lint bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/corral up $(ARGS)

test: $(STAMP)
	@command -v tmux >/dev/null 2>&1 || ./.ci/install-tmux
	@# The real omnigent server for tests/interop, built once and cached (exit 3: no Python
	@# >= 3.12 here, and the interop suite skips itself loudly).
	@./.ci/omnigent-venv >/dev/null || [ $$? -eq 3 ]
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: $(STAMP)
	@command -v tmux >/dev/null 2>&1 || ./.ci/install-tmux
	$(BIN)/python -m pytest -q -m "not interop and not chaos" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy corral

bench: $(STAMP)
	$(BIN)/corral bench bus

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
