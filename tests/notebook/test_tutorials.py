"""The tutorials in notebooks/: every one runs in the suite (nbval), a failing one fails it, and what is stored
in them is the output of a run, without library noise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.conftest import wait_no_children
from tests.notebook import parameters

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
NOISE = ("Monarch internal logs are being written", "[RdmaXcel]", "Can't open libcuda")


def test_the_ten_tutorials_are_numbered_stories():
    assert [p.name[:2] for p in TUTORIALS] == ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10"]
    for path in TUTORIALS:
        first = nbformat.read(path, as_version=4).cells[0]
        assert first.cell_type == "markdown" and first.source.startswith(f"# {path.name[:2]} · "), path.name


def test_the_suite_collects_every_tutorial():
    """`make test` runs pytest with the project's settings (testpaths include notebooks/, --nbval-lax):
    every tutorial's cells are test items."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "notebooks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for path in TUTORIALS:
        cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        items = re.findall(rf"^notebooks/{re.escape(path.name)}::Cell \d+$", out.stdout, re.M)
        assert len(items) == len(cells), (path.name, len(items), len(cells))


def test_a_tutorial_whose_cell_raises_fails_the_suite(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("raise RuntimeError('tutorial broke')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "99_broken.ipynb")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(ROOT / "pyproject.toml"),
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 1 and "1 failed, 1 passed" in out.stdout, out.stdout[-3000:]
    assert "tutorial broke" in out.stdout
    assert wait_no_children() == []


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.name)
def test_stored_outputs_are_a_whole_run_without_library_noise(path):
    nb = nbformat.read(path, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code"]
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{path.name}: not one run top to bottom: {counts}"
    for cell in cells:
        expected_error = "raises-exception" in cell.metadata.get("tags", [])
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert bool(errors) == expected_error, f"{path.name}: {cell.source[:60]!r} errors {errors}"
        text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in cell.outputs)
        assert not [n for n in NOISE if n in text], f"{path.name}: library noise in {cell.source[:60]!r}"
    for cell in cells:  # a cell that draws (matplotlib, the dashboard) stores a picture GitHub can show
        if "plt." in cell.source or ".dashboard()" in cell.source:
            pictures = [o for o in cell.outputs if "image/png" in o.get("data", {})]
            assert pictures, f"{path.name}: no picture stored for {cell.source[:60]!r}"


def test_the_suites_shorter_values_name_knobs_the_tutorials_have(monkeypatch):
    """tests/notebook/parameters.py: each value is assigned in a cell tagged `parameters` of an existing tutorial,
    and is smaller than the tutorial's own (the suite runs them shorter, never longer)."""
    monkeypatch.delenv("FORGE_NB_TUTORIALS", raising=False)
    names = {p.name for p in TUTORIALS}
    for name, values in parameters.SUITE.items():
        assert name in names, name
        cells = nbformat.read(ROOT / "notebooks" / name, as_version=4).cells
        assert parameters.values_for(cells, name) == values
        written = "\n".join(c.source for c in cells if parameters.is_parameters(c))
        for key, value in values.items():
            assert value < eval(parameters.assigned(written, key).group(0).split("=", 1)[1].split("#")[0]), key
    with pytest.raises(ValueError, match="assigns STEPS"):
        parameters.values_for([nbformat.v4.new_code_cell("N = 3")], "01_quickstart.ipynb")
