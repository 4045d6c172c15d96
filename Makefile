# Two entry points that do all their own set-up on a fresh machine:
#   make run   — create the virtualenv if needed, install corral (without the dev extra: a
#                user running it needs no pytest, ruff or mypy), start `corral up`
#   make test  — the same set-up plus the dev extra (and the real omnigent server for
#                tests/interop and the coding-agent CLIs for the claude-sdk/codex/pi kinds),
#                then the whole suite
#   make test-fast — the same set-up, then all but the interop and chaos tests
# The fast part runs on JOBS pytest workers (pytest-xdist; default: one per core), a test
# module per worker at a time, so a module's shared host stays in one process. make test (and
# so CI) runs it so too, then the chaos and interop tests one at a time: they time crashes (a
# 0.6 s heartbeat window) and the real server, which a second worker's load would distort
# (docs/testing.md). Both parts always run; either failing fails the target.
# The interpreter a new venv is made with: .ci/find-python prefers 3.12 (what the container
# image ships and the oldest omnigent runs on: docs/benchmarks.md, "Which CPython"), then any
# other >= 3.11. Evaluated only when the venv does not exist yet.
PYTHON ?= $(shell ./.ci/find-python 2>/dev/null || echo python3)
JOBS   ?= auto
VENV   ?= .venv
BIN    := $(VENV)/bin
# .installed-run: corral and what it needs to run; .installed: that and the dev extra.
RUN_STAMP := $(VENV)/.installed-run
STAMP  := $(VENV)/.installed
FAST   := -m "not interop and not chaos" -n $(JOBS) --dist loadfile
SERIAL := -m "interop or chaos"

.PHONY: run test test-fast test-unit lint bench clean

$(RUN_STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	@touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

run: $(RUN_STAMP)
	$(BIN)/corral up $(ARGS)

test: $(STAMP)
	@command -v tmux >/dev/null 2>&1 || ./.ci/install-tmux
	@command -v bwrap >/dev/null 2>&1 || ./.ci/install-bwrap
	@# The real omnigent server for tests/interop, built once and cached (exit 3: no Python
	@# >= 3.12 here, and the interop suite skips itself loudly).
	@./.ci/omnigent-venv >/dev/null || [ $$? -eq 3 ]
	@# The coding-agent CLIs of the claude-sdk, codex and pi kinds, pinned and cached (exit 3:
	@# no npm here, and their tests skip themselves loudly).
	@./.ci/install-clis $(BIN)/python >/dev/null || [ $$? -eq 3 ]
	@status=0; \
	$(BIN)/python -m pytest -q $(FAST) $(PYTEST_ARGS) || status=$$?; \
	$(BIN)/python -m pytest -q $(SERIAL) $(PYTEST_ARGS) || status=$$?; \
	exit $$status

test-fast: $(STAMP)
	@command -v tmux >/dev/null 2>&1 || ./.ci/install-tmux
	@command -v bwrap >/dev/null 2>&1 || ./.ci/install-bwrap
	@./.ci/install-clis $(BIN)/python >/dev/null || [ $$? -eq 3 ]
	$(BIN)/python -m pytest -q $(FAST) $(PYTEST_ARGS)

# The unit tests alone. CI runs them a second time on a 3.11 venv of their own (the floor of
# requires-python) when make test's venv has a newer Python: see .ci/run.
test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit -n $(JOBS) $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy corral

bench: $(STAMP)
	$(BIN)/corral bench bus

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
