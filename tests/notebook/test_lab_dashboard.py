"""The dashboard in a real JupyterLab, in Debian's headless Chromium driven by Playwright."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.notebook.lab import CHROMIUM_FLAGS, jupyter_lab, run_all_cells, write_notebook

pytestmark = pytest.mark.slow

CELLS = [
    "import forge_nb\n"
    "s = forge_nb.up(prompts_per_step=4, group_size=4, threads_per_proc=1)\n"
    "s.step(3)\n"
    "s.train(s.rollout())  # trained but not synced: the generator is one version behind",
    "s.dashboard()",
]


@pytest.fixture
def lab(tmp_path: Path):
    """A JupyterLab server with the dashboard notebook -> its URL and folder; stopped after, kernels too."""
    write_notebook(tmp_path / "dashboard.ipynb", CELLS)
    with jupyter_lab(tmp_path) as url:
        yield f"{url}/lab/tree/dashboard.ipynb?token=forge-nb-test", tmp_path


def test_dashboard_renders_sync_bumps_the_version_and_a_click_on_the_reward_curve_opens_that_step(lab):
    from playwright.sync_api import expect, sync_playwright

    url, tmp_path = lab
    shot = Path(os.environ.get("FORGE_NB_SCREENSHOT", tmp_path / "dashboard.png"))
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        try:
            _run_notebook_and_click_sync(page, url, expect)
            _click_a_reward_point(page, expect)
        finally:
            page.screenshot(path=str(shot), full_page=True)  # looked at by a person, and kept on failure
            browser.close()


def _run_notebook_and_click_sync(page, url: str, expect) -> None:
    page.goto(url)
    page.locator(".jp-Notebook").wait_for(timeout=60_000)
    expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_have_count(1, timeout=60_000)
    run_all_cells(page, expect, len(CELLS))
    board = page.locator(".forge-dashboard")
    version = board.locator(".forge-policy-generator")
    expect(version).to_have_text("v3", timeout=240_000)  # 3 synced steps; v4 is trained, not synced
    expect(board.locator(".js-plotly-plot")).to_have_count(1, timeout=60_000)
    expect(board.locator(".js-plotly-plot .scatterlayer .trace")).not_to_have_count(0)
    for name in ("Run", "Step", "Sync weights"):
        expect(board.get_by_role("button", name=name)).to_be_visible()
    board.get_by_role("button", name="Sync weights").click()
    expect(version).to_have_text("v4", timeout=30_000)
    expect(board.locator(".forge-versions")).to_contain_text("staleness 0")
    board.scroll_into_view_if_needed()


def _click_a_reward_point(page, expect) -> None:
    """Click the reward curve's second point (step 2): the explorer below opens with that step's groups."""
    board = page.locator(".forge-dashboard")
    point = board.locator(".js-plotly-plot .scatterlayer .trace").first.locator(".points path.point").nth(1)
    expect(point).to_have_count(1, timeout=30_000)
    box = point.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)  # plotly picks the point under the cursor on hover, then reports the click
    page.wait_for_timeout(300)
    page.mouse.click(x, y)
    explorer = board.locator(".forge-explorer")
    expect(explorer.locator(".forge-explorer-step")).to_have_text("Step 2", timeout=30_000)
    expect(explorer).to_contain_text("16 samples in 4 groups")
    expect(explorer.locator("details")).to_have_count(4)  # one per group, each with its samples' table
    expect(explorer.locator("table.forge-group").first).to_contain_text("reward/reward")
    explorer.locator("select").first.select_option(index=0)  # a sample: its tokens, trainer vs generator
    expect(explorer.locator(".forge-token").first).to_be_visible(timeout=30_000)
    explorer.locator(".forge-explorer-step").scroll_into_view_if_needed()
