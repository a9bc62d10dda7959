# Setup lives here so that a fresh machine needs nothing installed by hand.
# torch is pinned to the CPU build: a bare `torch` requirement would pull a multi-GB CUDA build.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(subst =,_,$(subst <,_,$(subst >,_,$(TORCH))))

.PHONY: setup setup-dev demo test lint format bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e .
	touch $(STAMP)

$(STAMP)-dev: $(STAMP)
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)-dev

setup: $(STAMP)

setup-dev: $(STAMP)-dev

demo: setup
	$(BIN)/trainguard run default

test: setup-dev
	$(BIN)/python -m pytest -q

lint: setup-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: setup
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache
