# The two commands a person types: `make demo` and `make test`.
# Each creates (or reuses) .venv from uv.lock by itself; uv is installed with
# pip into .tools/ when it is not on PATH.

SHELL := /bin/bash
PYTHON ?= python3
UV := $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
VENV := .venv
RUN := $(UV) run --frozen --no-sync
# The suite starts Python many times over (Synapse, bots, relays, the CLIs): each start
# reads cached bytecode (in __pycache__, which git ignores) instead of compiling every
# module again, even where the environment asks Python not to write any.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test lint types imports pytest clean

.tools/bin/uv:
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet uv

$(VENV)/.synced: uv.lock pyproject.toml | $(UV)
	$(UV) sync --frozen --all-extras
	touch $@

# DEMO_ARGS: e.g. `make demo DEMO_ARGS="--first 10 --more 100"` (the tests use a short story).
demo: $(VENV)/.synced
	$(RUN) gapline demo $(DEMO_ARGS)

test: $(VENV)/.synced lint types imports pytest

lint: $(VENV)/.synced
	$(RUN) ruff check src tests bench
	$(RUN) ruff format --check src tests bench

types: $(VENV)/.synced
	$(RUN) ty check

imports: $(VENV)/.synced
	$(RUN) lint-imports

# The suite runs on PYTEST_WORKERS processes (pytest-xdist; 0: in make's own pytest
# process), each with its own throwaway Synapse and PostgreSQL. Tests that start a
# homeserver of their own are grouped on one worker, so no two of those start at once.
PYTEST_WORKERS ?= 2

pytest: $(VENV)/.synced
	$(RUN) pytest -n $(PYTEST_WORKERS) --dist loadgroup

clean:
	rm -rf $(VENV) .tools .pytest_cache .ruff_cache
