"""The suite runs the tutorials with fewer training steps (papermill's convention: a cell tagged `parameters`
holds a tutorial's knobs, `STEPS = 1000`, and a run may set them to other values). A tutorial's stored outputs
come from a full-length run (`make notebooks`); under the suite every cell still runs, on the same code paths,
only shorter: the long cells were two thirds of the suite's time. FORGE_NB_TUTORIALS=full runs them as written.

Used by conftest.py (nbval's cells) and tests/test_binder.py (nbconvert in the Binder environment)."""

from __future__ import annotations

import os
import re

import nbformat

#: notebook file name -> {parameter: the suite's value}; each name is assigned in a cell tagged `parameters`.
SUITE: dict[str, dict[str, object]] = {
    "01_quickstart.ipynb": {"STEPS": 100},
    "02_live_reward.ipynb": {"FIRST": 20, "STEPS": 30},
    "03_live_loss.ipynb": {"SEGMENT": 15, "STEPS": 10, "SEEDS": 1},
    "04_weights_and_throughput.ipynb": {"STEPS": 30, "REFRESHES": 2},
    "05_your_data_and_a_real_model.ipynb": {"STEPS": 1, "FIXED": 2, "HELDOUT": 10, "UNCUT": 64},
    "06_async_and_staleness.ipynb": {"SECONDS": 8},
    "08_agents.ipynb": {"STEPS": 1, "TRIES": 1, "HELDOUT": 10},
    "09_debugging_a_run.ipynb": {"GOOD": 20, "LIMIT": 30, "AFTER": 10, "JUDGED": 1, "LORA_STEPS": 3, "LORA_SEEDS": 1},
    "10_a_session_that_outlives_its_kernel.ipynb": {"SECONDS": 3},
}


def enabled() -> bool:
    return os.environ.get("FORGE_NB_TUTORIALS", "short") != "full"


def is_parameters(cell) -> bool:
    return cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", [])


def assigned(source: str, name: str) -> re.Match | None:
    return re.search(rf"^{re.escape(name)} = .*$", source, re.M)


def values_for(cells: list, name: str) -> dict[str, object]:
    """The suite's values for the notebook `name` whose code cells are `cells`; a value that no parameters cell
    assigns is an error (a renamed knob must not silently run the tutorial at full length)."""
    values = SUITE.get(name, {}) if enabled() else {}
    sources = [c.source for c in cells if is_parameters(c)]
    for key in values:
        if not any(assigned(s, key) for s in sources):
            raise ValueError(f"{name}: no cell tagged `parameters` assigns {key} (tests/notebook/parameters.py)")
    return values


def apply(source: str, values: dict[str, object]) -> str:
    """`source` (a parameters cell) with each `NAME = ...` line it has of `values` set to that value."""
    for key, value in values.items():
        line = f"{key} = {value!r}  # the test suite's value (tests/notebook/parameters.py)"
        source = re.sub(rf"^{re.escape(key)} = .*$", lambda _, line=line: line, source, flags=re.M)
    return source


def shortened(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """A copy of the notebook `name` with the suite's values in its parameters cells."""
    nb = nbformat.from_dict(nb)
    values = values_for(nb.cells, name)
    for cell in nb.cells:
        if values and is_parameters(cell):
            cell.source = apply(cell.source, values)
    return nb
