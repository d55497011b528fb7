"""Suite-wide settings (tests/ and notebooks/): sessions use the plain-torch engine unless a test asks
for vLLM by name, so the suite does not pay vLLM's ~45 s start for every session; run directories
(rollout logs, trackers, periodic checkpoints) go to the run's temporary folder (tests/suite_tmp.py), removed
at the end, not into the checkout (run ids carry the pid, so parallel workers share it safely); OpenMP threads
wait passively (see below). Kernels and procs started by the tests inherit all three.

How the suite is split (docs/development.md): every item gets, at collection, the markers below and
an xdist group, so a new test file needs no opt-in.

- group: its own file (a module's fixtures, e.g. its one mesh, start once, on one worker; a notebook's
  cells run in order in one kernel), but every item that starts the test Slurm (fixed ports) shares
  the group "slurm", so two clusters never run at once. `make test` runs `pytest -n 3 --dist loadgroup`;
  pytest_xdist_make_scheduler below hands out whole groups (xdist's own loadgroup does not, see there).
- markers: `tutorial` (a notebook cell under nbval), `slurm` (starts the test Slurm), `browser`
  (JupyterLab in Chromium), `mesh` (its file starts a local mesh), `netns` (namespace hosts); `make test-fast`
  deselects those and `slow`.
"""

import os
import re
import sys
from pathlib import Path

import pytest

from tests import suite_tmp

# "auto" means the torch engine in the suite: vLLM's start (~20 s) is tested where a test asks for it by name.
os.environ.setdefault("FORGE_NB_ENGINE", "torch")
# Two test files at once run two meshes of 4-5 procs each, with two OpenMP threads each, on 2 cores. OpenMP
# threads spin after each parallel region by default, so the procs of one mesh burnt the cores the other
# needed: tutorial 05 took 49 s alone and 208 s beside tutorial 01, 66 s with passive waits (01: 179 -> 38 s).
# Alone, passive waits cost a single process latency (benchmarks/overhead.py: 36 -> 63 ms a step), so outside
# the suite a local mesh's procs only spin briefly (launch/local.py). Read when torch loads (every proc, kernel).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The suite's Python environment is active, as a user's shell would have it (`source .venv/bin/activate`):
# an exported run.sbatch runs the `python3` of the job's PATH, which sbatch takes from the submitting process.
_bin = os.path.dirname(os.path.abspath(sys.executable))
if _bin not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _bin + os.pathsep + os.environ.get("PATH", "")
# A worker's sessions fork their procs from one server (forge_nb/launch/forks/server.py) that lingers between them,
# not one per session: a session's start imported torch and transformers in a new server each time, ~3.7 s of
# CPU, and the suite starts some 200 sessions on 2 cores. Outside the suite down() stops the server (linger 0);
# the tests of that default set it back to 0 themselves. Kernels and subprocesses inherit it; each one's server
# ends with it.
os.environ.setdefault("FORGE_NB_FORK_LINGER_S", "900")
# Temporary files of every process of the run in one folder of the run, removed at its end; what the tests
# leave there fails the run (tests/suite_tmp.py). The run directories go there too.
suite_tmp.set_up()
# Each worker's sessions (their servers' folders, `forge_nb.server.registry`) apart from the user's and the other
# worker's: a test's `forge-nb down --all` ends its worker's sessions only. A session left running is a leftover.
os.environ["FORGE_NB_RUNTIME_DIR"] = os.path.join(os.environ["TMPDIR"], "forge_nb-sessions")

MARKERS = {
    "tutorial": "a tutorial's cell, executed by nbval (make test-fast leaves these out)",
    "slurm": "starts the three-node Slurm of tests/slurm_cluster.py (one at a time: fixed ports)",
    "browser": "JupyterLab in Chromium (Playwright)",
    "mesh": "in a file that starts a local Monarch mesh (forge_nb.up / resume, %forge up, `session`, LocalMesh)",
    "netns": "makes network-namespace hosts (forge_nb.testing.netns_hosts, root; skipped where they cannot be made)",
}
# What, in a test file's or notebook's text, says that it starts a Slurm or a browser.
SLURM_SIGNS = ("LocalSlurm", "slurm_cluster")
BROWSER_SIGNS = ("playwright", "chromium")
NETNS_SIGNS = ("netns_hosts",)  # its namespaces, bridge and subnet are named after the pid: no fixed addresses
MESH_SIGNS = re.compile(r"forge_nb\.(up|resume)\(|%forge up|(?<![\w.])(up|resume)\(|\bsession\)|\bLocalMesh\(")


SLURM_FIXTURE = re.compile(r"def test_\w*\([^)]*\bslurm\b")


def file_group(path: Path, root: Path, cache: dict[Path, str]) -> str:
    """The xdist group of every item of the file `path`: "slurm" if it starts the local Slurm (its text
    says so, or a test of it asks for the `slurm` fixture), else the file itself."""
    text = _source(path, cache)
    if any(s in text for s in SLURM_SIGNS) or SLURM_FIXTURE.search(text):
        return "slurm"
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def pytest_xdist_make_scheduler(config, log):
    """xdist's own `--dist loadgroup` does not group with pytest 9 here (the `@group` it appends to node
    ids is lost), so the scheduler is xdist's loadscope with file_group() as the scope: one file, or the
    "slurm" group, to one worker at a time. Groups are handed out in collection order, which
    `pytest_collection_modifyitems` makes longest first (`durations.json`); xdist's own reordering, by
    number of tests, put one-test files of minutes (the binder build) last, on one worker, the other idle."""
    from xdist.scheduler import LoadScopeScheduling

    cache: dict[Path, str] = {}
    config.option.loadscopereorder = False

    class FileGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return file_group(config.rootpath / nodeid.split("::", 1)[0], config.rootpath, cache)

    return FileGroupScheduling(config, log)


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def _source(path: Path, cache: dict[Path, str]) -> str:
    if path not in cache:
        try:
            cache[path] = path.read_text(errors="replace")
        except OSError:
            cache[path] = ""
    return cache[path]


@pytest.hookimpl(tryfirst=True)  # before pytest-random-order's, which reads `random_order` markers
def pytest_collection_modifyitems(config, items):
    cache: dict[Path, str] = {}
    groups: dict[Path, str] = {}  # a file's group: a module's fixtures must start on one worker only
    for item in items:
        path = Path(str(item.path))
        text = _source(path, cache)
        if path.suffix == ".ipynb":
            item.add_marker(pytest.mark.tutorial)
            item.add_marker(pytest.mark.random_order(disabled=True))  # a notebook's cells run top to bottom
            # A long cell (01's step(1000)) ran past the 600 s default on 2 loaded cores; nbval's own limit is 2000 s.
            item.add_marker(pytest.mark.timeout(1800))
        if "slurm" in getattr(item, "fixturenames", ()) or any(s in text for s in SLURM_SIGNS):
            item.add_marker(pytest.mark.slurm)
            groups[path] = "slurm"
        if any(s in text for s in BROWSER_SIGNS):
            item.add_marker(pytest.mark.browser)
        if any(s in text for s in NETNS_SIGNS):
            item.add_marker(pytest.mark.netns)
        if path.suffix == ".py" and MESH_SIGNS.search(text):
            item.add_marker(pytest.mark.mesh)
        groups.setdefault(path, file_group(path, config.rootpath, cache))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[Path(str(item.path))]))
    longest_groups_first(items, groups, config.rootpath)
    shorten_tutorials(items)


#: Seconds each test file took in a measured `make test` (`python tests/durations.py JUNIT_XML` writes it):
#: groups run longest first, so the workers finish together. A file not in it counts DEFAULT_SECONDS.
DURATIONS = Path(__file__).parent / "tests" / "durations.json"
DEFAULT_SECONDS = 10.0


def longest_groups_first(items, groups: dict[Path, str], root: Path) -> None:
    """Reorder `items` in place: whole groups, longest (by `DURATIONS`) first, each group's items in their
    order (a notebook's cells top to bottom). Without the file the order stays as collected."""
    if not DURATIONS.is_file():
        return
    import json

    seconds = json.loads(DURATIONS.read_text())
    per_group: dict[str, float] = {}
    for path, group in groups.items():
        name = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
        per_group[group] = per_group.get(group, 0.0) + seconds.get(name, DEFAULT_SECONDS)
    order = {group: i for i, group in enumerate(sorted(per_group, key=lambda g: -per_group[g]))}
    items.sort(key=lambda item: order[groups[Path(str(item.path))]])  # stable: items keep their order in a group


def shorten_tutorials(items) -> None:
    """Tutorials run with the suite's values in their `parameters` cells (fewer steps; see
    tests/notebook/parameters.py)."""
    from tests.notebook import parameters

    cells: dict[Path, list] = {}
    for item in items:
        if hasattr(item, "cell"):  # nbval's IPyNbCell
            cells.setdefault(Path(str(item.path)), []).append(item)
    for path, found in cells.items():
        values = parameters.values_for(found[0].parent.nb.cells, path.name)  # the whole notebook's
        for item in found:
            if values and parameters.is_parameters(item.cell):
                item.cell.source = parameters.apply(item.cell.source, values)


@pytest.hookimpl(trylast=True)  # after xdist's, which stops the workers (their fork servers, their kernels)
def pytest_sessionfinish(session, exitstatus):
    """The run fails when its tests left files with data in its temp folder (tests/suite_tmp.py): named here."""
    from forge_nb.server import zygote

    zygote.stop_all()  # this process's runtime folder's zygotes (they fork session servers and outlive sessions)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    forks = sys.modules.get("forge_nb.launch.forks.server")
    if forks is not None:  # without workers (-n 0) the tests ran here: the lingering fork server is this run's
        forks._stop_idle()
    suite_tmp.clean_up_at_exit_now()  # without workers the tests ran here too: what this process removes at exit
    found = suite_tmp.leftovers()
    if not found:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:  # (none with -p no:terminal)
        reporter.write_sep("=", "files left behind", red=any(found.values()))
        reporter.write_line(suite_tmp.describe(found))
    if any(found.values()) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
