# Setup lives here so that a fresh machine needs nothing installed by hand.
# torch: TORCH is the requirement, TORCH_INDEX the index it comes from (empty: pip's own
# configuration, PyPI by default). From PyPI, torch on Linux is the CUDA build: several GB, and
# it runs on a CPU too. CPU-only machines get the small CPU build from PyTorch's CPU index:
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128   # a given CUDA version
PYTHON ?= python3
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(subst =,_,$(subst <,_,$(subst >,_,$(TORCH))))$(if $(strip $(TORCH_INDEX)),-$(notdir $(TORCH_INDEX)),-pypi)

# pip --quiet still prints one warning per package when pip's configuration names a local
# index folder that lacks the package ("Location '...' is ignored: it is neither a file nor a
# directory"). Exactly that message is filtered out; every other line, errors included, passes,
# and pip's exit status is kept (pipefail).
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
PIP_FILTER = 2>&1 | { grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory\.$$" || true; }

.PHONY: setup setup-dev browser demo test lint format bench clean

$(BIN)/python:
	@echo "creating $(VENV)"
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade pip $(PIP_FILTER)

$(STAMP): $(BIN)/python pyproject.toml
	@echo "installing $(TORCH)$(if $(strip $(TORCH_INDEX)), from $(TORCH_INDEX)) and trainguard into $(VENV)"
	@$(BIN)/pip install --quiet "$(TORCH)" $(if $(strip $(TORCH_INDEX)),--index-url $(TORCH_INDEX)) $(PIP_FILTER)
	@$(BIN)/pip install --quiet -e . $(PIP_FILTER)
	@touch $(STAMP)

$(STAMP)-dev: $(STAMP)
	@echo "installing the dev extras (tests, lint, benchmarks) into $(VENV)"
	@$(BIN)/pip install --quiet -e ".[dev]" $(PIP_FILTER)
	@touch $(STAMP)-dev

setup: $(STAMP)

setup-dev: $(STAMP)-dev

demo: setup
	$(BIN)/trainguard run default

# Two pytest-xdist workers (pytest's tmp_path is per worker; tests take ports from the OS).
# The timing-based tests (stragglers, hangs, watchdogs, doctor) share xdist_group("timing-serial")
# and so run one after the other on one worker (`--dist loadgroup` in pyproject.toml).
TEST_WORKERS ?= 2

test: setup-dev browser
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# The report's browser test (tests/test_report_browser.py) drives Debian's headless Chromium
# through its ChromeDriver. Installed with apt where make runs as root with apt (CI); anywhere
# else, or if apt cannot, that test is skipped and says why.
APT_CHROMIUM = DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver
browser:
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing chromium and chromium-driver with apt (the report's browser test)"; \
	    { $(APT_CHROMIUM) || { apt-get update -q && $(APT_CHROMIUM); }; } >/dev/null 2>&1 \
	      || echo "apt could not install chromium: the browser test will be skipped"; \
	  else \
	    echo "no chromium: the browser test will be skipped (apt install chromium chromium-driver)"; \
	  fi; \
	fi

lint: setup-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup-dev
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: setup-dev
	$(BIN)/python benchmarks/run_all.py --out runs/bench/summary.md

clean:
	rm -rf $(VENV) runs .pytest_cache
