"""The forge sidebar (extensions/jupyterlab-forge) in a real JupyterLab, in Debian's headless Chromium
driven by Playwright: no session, a session from `%forge up`, Sync, Run/Pause, switching notebooks and
a kernel restart. Screenshots go to $FORGE_NB_SCREENSHOTS (a folder) if set, else the test's tmp dir."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.conftest import wait_no_children
from tests.notebook.lab import CHROMIUM_FLAGS, jupyter_lab, run_all_cells, write_notebook

pytestmark = pytest.mark.slow

NOTEBOOKS = {
    "plain.ipynb": ["1 + 1", "import forge_nb  # imported, not loaded with %load_ext: the sidebar finds it anyway"],
    "forge.ipynb": [
        "%load_ext forge_nb",
        "s = %forge up prompts_per_step=4 group_size=4 threads_per_proc=1",
        "%forge step 2",
        "s.train(s.rollout())  # trained, not synced: the generator serves v2, the trainer has v3",
    ],
}


@pytest.fixture
def lab(tmp_path: Path):
    """A JupyterLab server with the two notebooks -> base URL, token, folder; checked to leave no process."""
    for name, cells in NOTEBOOKS.items():
        write_notebook(tmp_path / name, cells)
    token = "forge-nb-sidebar-test"
    with jupyter_lab(tmp_path, token) as url:
        yield url, token, tmp_path
    assert wait_no_children(timeout=30) == []  # nor Chromium, nor Playwright's driver


def test_extension_is_installed_and_enabled():
    out = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True, text=True, check=True
    )
    listing = out.stdout + out.stderr
    assert "jupyterlab-forge" in listing, listing
    line = next(line for line in listing.splitlines() if "jupyterlab-forge" in line)
    assert "enabled" in line and "OK" in line and "forge_nb" in line, line


def test_sidebar_follows_the_notebook_session_sync_run_pause_and_restart(lab):
    from playwright.sync_api import expect, sync_playwright

    url, token, tmp_path = lab
    shots = Path(os.environ.get("FORGE_NB_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
        page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
        try:
            _walk_through(page, f"{url}/lab/tree/plain.ipynb?token={token}", shots, expect)
        finally:
            page.screenshot(path=str(shots / "sidebar-last.png"))  # kept on failure, for a person to look at
            browser.close()
    # Nothing the sidebar does may throw into the console (JupyterLab's own messages are not ours).
    assert [e for e in errors if "forge" in e.lower()] == []


def _walk_through(page, url: str, shots: Path, expect) -> None:
    page.goto(url)
    page.locator(".jp-Notebook").wait_for(timeout=60_000)
    _wait_idle(page, expect)
    sidebar = _open_sidebar(page)

    # 1. A kernel without a session: said plainly, with the two lines that start one. (The sidebar's probe imports
    # forge_nb's light sidebar module, no torch, to learn whether this notebook has a session to attach to.)
    empty = sidebar.locator(".jp-ForgeSidebar-empty")
    expect(empty).to_contain_text("No forge session in this kernel", timeout=30_000)
    expect(empty).to_have_attribute("data-phase", "open")
    expect(sidebar.locator(".jp-ForgeSidebar-code")).to_have_text("%load_ext forge_nb\n%forge up")
    page.screenshot(path=str(shots / "sidebar-no-session.png"))

    # 2. `%forge up` in another notebook: the sidebar switches to it and shows the session.
    page.locator(".jp-DirListing-item[title^='Name: forge.ipynb']").dblclick()
    expect(sidebar.locator(".jp-ForgeSidebar-notebook")).to_have_text("forge.ipynb", timeout=30_000)
    _wait_idle(page, expect)
    run_all_cells(page, expect, len(NOTEBOOKS["forge.ipynb"]))
    policy = sidebar.locator(".jp-ForgeSidebar-policy")
    expect(sidebar.locator(".jp-ForgeSidebar-status")).to_contain_text("Session up", timeout=180_000)
    expect(policy).to_have_attribute("data-trainer", "3", timeout=180_000)
    expect(policy).to_have_attribute("data-generator", "2")
    expect(policy).to_have_text("v2 serving · v3 trained")
    expect(sidebar.locator(".jp-ForgeSidebar-actor")).not_to_have_count(0)
    expect(sidebar.locator(".jp-ForgeSidebar-actor.jp-mod-alive")).to_have_count(
        sidebar.locator(".jp-ForgeSidebar-actor").count()
    )
    expect(sidebar.locator(".jp-ForgeSidebar-rate")).not_to_have_text("– tok/s")
    status_item = page.locator(".jp-ForgeStatus")
    expect(status_item).to_contain_text("policy v2 (+1)")
    _wait_idle(page, expect)
    page.screenshot(path=str(shots / "sidebar-session.png"))

    # 3. Sync: the served version goes up.
    sidebar.locator(".jp-ForgeSidebar-sync").click()
    expect(policy).to_have_attribute("data-generator", "3", timeout=60_000)
    expect(policy).to_have_text("v3 serving")
    expect(sidebar.locator(".jp-ForgeSidebar-note")).to_contain_text("Sync: policy v3 served")
    expect(status_item).to_contain_text("policy v3 ·")
    page.screenshot(path=str(shots / "sidebar-synced.png"))

    # 4. Run, then Pause: a background run trains; the button follows its state.
    run = sidebar.locator(".jp-ForgeSidebar-run")
    expect(run).to_have_text("Run")
    run.click()
    state = sidebar.locator(".jp-ForgeSidebar-runState")
    expect(state).to_have_attribute("data-state", "running", timeout=30_000)
    expect(policy).not_to_have_attribute("data-trainer", "3", timeout=120_000)  # it trained a step
    expect(run).to_have_text("Pause")
    run.click()
    expect(state).to_have_attribute("data-state", "paused", timeout=120_000)
    expect(run).to_have_text("Resume")
    page.screenshot(path=str(shots / "sidebar-paused.png"))

    # 5. Back to the notebook without forge_nb, then to this one: the sidebar follows.
    _tab(page, "plain.ipynb").click()
    expect(sidebar.locator(".jp-ForgeSidebar-notebook")).to_have_text("plain.ipynb")
    expect(empty).to_contain_text("No forge session in this kernel", timeout=30_000)
    page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(1).locator(".jp-InputPrompt").click()
    page.keyboard.press("Shift+Enter")  # `import forge_nb`: the sidebar's probe registers the comm target
    expect(empty).to_have_attribute("data-phase", "open", timeout=60_000)
    expect(empty).to_contain_text("No forge session in this kernel")
    _tab(page, "forge.ipynb").click()
    expect(policy).to_be_visible(timeout=30_000)

    # 6. A kernel restart leaves the session to its server: the sidebar says so and attaches on a click, to the
    # same procs.
    pids = [int(pid) for text in sidebar.locator(".jp-ForgeSidebar-pids").all_text_contents() for pid in _numbers(text)]
    assert pids and all(psutil.pid_exists(pid) for pid in pids)
    page.locator(".jp-NotebookPanel:visible .jp-Toolbar-item[data-jp-item-name='restart'] button").click()
    page.locator(".jp-Dialog .jp-mod-accept").click()
    attach = sidebar.locator(".jp-ForgeSidebar-attach")
    expect(sidebar.locator(".jp-ForgeSidebar-attachText")).to_contain_text("is still running", timeout=90_000)
    expect(status_item).to_contain_text("running · not attached")
    page.screenshot(path=str(shots / "sidebar-attach.png"))
    attach.click()
    expect(sidebar.locator(".jp-ForgeSidebar-status")).to_contain_text("Session", timeout=60_000)
    expect(policy).to_be_visible()
    again = [
        int(pid) for text in sidebar.locator(".jp-ForgeSidebar-pids").all_text_contents() for pid in _numbers(text)
    ]
    assert sorted(again) == sorted(pids)  # the same procs: nothing was restarted with the kernel
    page.screenshot(path=str(shots / "sidebar-attached.png"))


def _numbers(text: str) -> list[str]:
    """The pids in "pid 123" or "pids 1, 2"."""
    return [word.strip(",") for word in text.split()[1:]]


def _open_sidebar(page):
    page.locator(".jp-SideBar .lm-TabBar-tab[data-id='jp-forge-sidebar']").click()
    sidebar = page.locator("#jp-forge-sidebar")
    sidebar.wait_for(state="visible", timeout=30_000)
    return sidebar


def _tab(page, name: str):
    return page.locator(f".lm-DockPanel-tabBar .lm-TabBar-tab:has-text('{name}')")


def _wait_idle(page, expect) -> None:
    """The status bar's kernel indicator (it follows the current notebook) says Idle."""
    expect(page.locator(".jp-Notebook-ExecutionIndicator").first).to_have_attribute(
        "data-status", "idle", timeout=60_000
    )
