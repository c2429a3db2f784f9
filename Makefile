# One entry point for set-up, tests and experiments. Every target depends on the
# venv stamp, so a fresh clone installs on first use and never twice.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
REQS   := requirements/cpu.txt requirements/cpu-lock.txt pyproject.toml

export OMP_NUM_THREADS ?= 1
export WANDB_MODE ?= offline

.PHONY: setup test test-fast lint bench-core prepare clean-venv

setup: $(STAMP)

$(STAMP): $(REQS)
	@echo ">> creating $(VENV) and installing pinned dependencies (first run only, ~3 min)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/cpu.txt -c requirements/cpu-lock.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@echo ">> fetching the offline GPT-2 BPE asset (pinned sha256; see data_prep/assets.py)"
	$(PY) -m data_prep.assets
	@touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Prepare a corpus as Megatron indexed datasets (default: the offline Wikipedia sample).
# Hydra overrides go in ARGS, e.g. make prepare ARGS="data=openwebtext tokenizer=gpt2"
prepare: $(STAMP)
	$(PY) -m pipelines.prepare $(ARGS)

bench-core: $(STAMP)
	$(PY) -m benchmarks.core $(ARGS)

clean-venv:
	rm -rf $(VENV)
