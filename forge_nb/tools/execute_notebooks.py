"""Execute tutorials in place, so their stored outputs are those of a real run, as a reader sees them.

``python -m forge_nb.tools.execute_notebooks notebooks/01_quickstart.ipynb ...`` (``make notebooks`` runs all).
Each notebook runs top to bottom in a fresh kernel from its own folder (cells tagged ``raises-exception`` may
raise; any other error stops it and leaves the file as it was). Then, as JupyterLab shows it after the run:

- the widgets still open are stored with the notebook (nbviewer renders them), except those that carry their
  own picture (the dashboard's PNG of its panels): they are stored as that picture, which every viewer shows
  (GitHub's, JupyterLab's without a kernel), not as megabytes of plotly's JavaScript in widget state that
  nothing but a live kernel could bring back to life;
- the outputs of widgets closed during the run are dropped: a progress bar that removed itself (tqdm's
  ``leave=False``) shows nothing in JupyterLab, but its text fallback would read "0%" in any other viewer.

Prints each notebook's wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


class RecordingClient(NotebookClient):
    """nbclient's executor, which keeps the state of every widget it saw opened; this one also records
    which were closed again (nbclient ignores ``comm_close``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.closed: set[str] = set()

    def handle_comm_msg(self, outs, msg, cell_index) -> None:
        if msg["msg_type"] == "comm_close":
            self.closed.add(msg["content"]["comm_id"])
        super().handle_comm_msg(outs, msg, cell_index)


def execute(path: Path, timeout: float = 900.0, kernel: str = "python3") -> float:
    """Run the notebook at `path`, keep what JupyterLab would show, write it back -> seconds taken."""
    nb = nbformat.read(path, as_version=4)
    client = RecordingClient(
        nb,
        timeout=timeout,
        kernel_name=kernel,
        resources={"metadata": {"path": str(path.parent)}},
        store_widget_state=True,
        record_timing=False,  # no per-cell timestamps: a re-run changes only what the cells show
    )
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    as_pictures(nb)
    drop_closed_widgets(nb, client.closed)
    nbformat.write(nb, path)
    return seconds


def as_pictures(nb: nbformat.NotebookNode) -> int:
    """Store every widget output that also carries an image as the image alone -> how many. (The widget's
    state then goes with `drop_closed_widgets`' pruning: no output shows it.)"""
    changed = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = output.get("data", {})
            if WIDGET_VIEW in data and any(k.startswith("image/") for k in data):
                del data[WIDGET_VIEW]
                changed += 1
    return changed


def drop_closed_widgets(nb: nbformat.NotebookNode, closed: set[str]) -> int:
    """Remove the outputs that show a widget in `closed`, and from the stored widget state every model
    that no remaining output shows (directly or as a child) -> how many outputs were removed."""
    dropped = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            kept = [o for o in cell.outputs if _widget(o) not in closed]
            dropped += len(cell.outputs) - len(kept)
            cell.outputs = kept
    stored = nb.metadata.get("widgets", {}).get(WIDGET_STATE)
    if stored is not None:
        shown = [_widget(o) for c in nb.cells if c.cell_type == "code" for o in c.outputs if _widget(o)]
        stored["state"] = {k: v for k, v in stored["state"].items() if k in _reachable(shown, stored["state"])}
        if not stored["state"]:
            del nb.metadata["widgets"]
    return dropped


def _reachable(roots: list[str], state: dict) -> set[str]:
    """Model ids in `roots` and every model their state refers to ("IPY_MODEL_<id>"), transitively."""
    seen, todo = set(), list(roots)
    while todo:
        model = todo.pop()
        if model in seen or model not in state:
            continue
        seen.add(model)
        todo += re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(state[model]))
    return seen


def _widget(output: nbformat.NotebookNode) -> str | None:
    """The model id of the widget an output shows, or None."""
    return output.get("data", {}).get(WIDGET_VIEW, {}).get("model_id")


def activate() -> None:
    """Put this Python's environment first on PATH, as `source .venv/bin/activate` would: the kernels run
    with it, so a tutorial's shell commands (`sbatch` of an exported run, whose job runs `python3`) find it."""
    here = os.path.dirname(os.path.abspath(sys.executable))
    if here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one cell may take (default 900)")
    args = parser.parse_args()
    activate()
    for path in args.notebooks:
        seconds = execute(path, args.timeout)
        print(f"{path}: {seconds:.0f} s", flush=True)


if __name__ == "__main__":
    main()
