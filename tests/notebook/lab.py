"""A real JupyterLab server for browser tests (Debian's headless Chromium driven by Playwright): notebooks
written from cell sources, token auth on loopback, no news toast, no restored layout; stopped after,
kernels and their mesh procs included, and checked to leave no process behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import nbformat
import psutil

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def write_notebook(path: Path, cells: list[str]) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def jupyter_lab(root: Path, token: str = "forge-nb-test") -> Iterator[str]:
    """JupyterLab serving `root` -> its base URL (add ``?token=`` + `token`)."""
    settings = root / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    # No "would you like to be notified about news" toast over the notebook.
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    # The notebook's own kernel (python3) starts with it, no "Select Kernel" dialog: Lab puts one up when the
    # kernel specs come late (a loaded machine); behind it, a CI run's second cell never ran ("[ ]:" after the first).
    tracker = root / "settings" / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True, exist_ok=True)
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"autoStartDefaultKernel": True}))
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": str(root / "settings"),
        "JUPYTERLAB_WORKSPACES_DIR": str(root / "workspaces"),  # no layout restored from another run
        "JUPYTER_RUNTIME_DIR": str(root / "rt"),
    }
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(root / "server.log").open("w"),
        # SIGINT stops it below; a suite started in the background (`cmd &` in a script) ignores SIGINT, and a
        # child inherits that: the server would never stop.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            time.sleep(0.5)
    try:
        yield url
    finally:
        # The notebooks' sessions outlive their kernels, in their servers: ended here, as a user would end them
        # (forge-nb down --all: this worker's sessions only, see conftest.py).
        from forge_nb.server import start

        start.down()
        procs = [server, *(psutil.Process(server.pid).children(recursive=True))]
        server.send_signal(signal.SIGINT)  # jupyter asks to confirm on the first ^C: the second stops it
        time.sleep(0.5)
        server.send_signal(signal.SIGINT)
        _, alive = psutil.wait_procs([psutil.Process(p.pid) for p in procs if psutil.pid_exists(p.pid)], timeout=60)
        for p in alive:
            p.kill()
        assert alive == [], f"left running after the server stopped: {alive}"


def dismiss_dialog(page) -> None:
    """Close a JupyterLab dialog that stands in front of the notebook, saying which: on a loaded machine Lab
    can put one up that nothing in the test asked for (a server request that timed out, a kernel that took
    long to start), and a click behind it never lands."""
    dialog = page.locator(".jp-Dialog")
    if dialog.count() and dialog.first.is_visible():
        print(f"dismissed a JupyterLab dialog: {dialog.first.inner_text()!r}")
        buttons = dialog.first.locator(".jp-Dialog-button.jp-mod-accept")
        (buttons.first if buttons.count() else dialog.first.locator(".jp-Dialog-button").last).click()
        dialog.first.wait_for(state="detached", timeout=10_000)


def run_all_cells(page, expect, count: int) -> None:
    """Shift+Enter on each of the visible notebook's `count` cells in turn, as a person would, and check that
    each one queued or ran ("[*]:" or "[n]:"). Lab renders a notebook's cells one after another, so it first
    waits for all `count` (counting them at once can see only the first). A keystroke can be dropped -- a
    notebook shows "Idle" a moment before its kernel connection is up -- so a cell still at "[ ]:" is pressed
    again, never one that started (that would run it twice)."""
    cells = page.locator(".jp-NotebookPanel:visible .jp-Cell")
    expect(cells).to_have_count(count, timeout=60_000)
    for i in range(count):
        prompt = cells.nth(i).locator(".jp-InputPrompt")
        for _ in range(20):
            dismiss_dialog(page)
            prompt.click()
            page.keyboard.press("Shift+Enter")
            try:
                expect(prompt).not_to_have_text("[ ]:", timeout=3_000)
                break
            except AssertionError:  # the press was dropped: wait a moment and press again
                page.wait_for_timeout(1_000)
        else:
            raise AssertionError(f"cell {i + 1} never started executing")
