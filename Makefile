# The two commands of the README: `make demo` and `make test`. Each creates and fills .venv as needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint system-deps bench-overhead clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/forge-nb demo

lint: $(STAMP)
	$(BIN)/ruff check forge_nb tests benchmarks
	$(BIN)/ruff format --check forge_nb tests benchmarks

# Debian's Chromium for the JupyterLab browser test (Playwright cannot download its own here).
system-deps:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

test: lint system-deps
	$(BIN)/pytest

bench-overhead: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV)
