"""binder/ alone builds an environment that runs the quickstart: a copy of the repository (what a clone has),
a fresh virtualenv of binder/runtime.txt's Python, `pip install -r binder/requirements.txt` from the copy's root
(by uv from the suite's wheel cache when it holds them all: `install_requirements`), then `binder/postBuild`, as
repo2docker does; then tutorial 01 executes in that environment's own kernel
(`jupyter nbconvert --execute`, which stops at the first cell that raises), with the suite's shorter values
in its parameters cell, as under nbval (tests/notebook/parameters.py).

The build is cached (~/.cache/forge_nb/test-binder/<key>, or $FORGE_NB_TEST_CACHE) under a key that hashes
everything the build reads: binder/, pyproject.toml (the ranges of `-e .[models,notebooks]`), constraints.txt (the
lock, whose versions binder/requirements.txt installs) and the sidebar's sources (extensions/jupyterlab-forge, which
postBuild builds). A change to any of them builds afresh, as does FORGE_NB_BINDER_REBUILD=1. On a hit the copy's
files are replaced by this checkout's (the editable install then imports the current forge_nb; build outputs, which
a clone lacks, stay) and every check below runs again on the cached environment, then the tutorial."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from tests.conftest import wait_no_children
from tests.notebook import parameters

# A build by pip (no cache) is ~8 min on 2 loaded cores, the tutorial ~3 more: past the suite's 600 s default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = "01_quickstart.ipynb"  # in notebooks/, where it runs


BUILD_INPUTS = ("binder/", "pyproject.toml", "constraints.txt", "extensions/jupyterlab-forge/")  # what the build reads
MANIFEST = ".binder-test-files"  # in a cached copy: the files checkout() put there


def clone_files() -> list[str]:
    """The repository's files as a clone of this working tree would have them: tracked and untracked
    files, less what .gitignore ignores (no .venv, no built extension, no node_modules)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sorted(n for n in (n.decode() for n in listed) if n and (ROOT / n).is_file())


def checkout(dest: Path) -> Path:
    """Copy the clone's files into `dest`, replacing the files an earlier checkout() put there (what the
    build added, e.g. the built extension and node_modules, stays)."""
    old = dest / MANIFEST
    if old.exists():
        for name in old.read_text().splitlines():
            (dest / name).unlink(missing_ok=True)
    names = clone_files()
    for name in names:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dest / name)
    (dest / MANIFEST).write_text("\n".join(names))
    return dest


def build_key() -> str:
    """A hash of every file the build reads (their names and contents) and of the Python it uses."""
    digest = hashlib.sha256((ROOT / "binder" / "runtime.txt").read_bytes() + b"\0.pyc")  # (builds since: with .pyc)
    for name in clone_files():
        if name.startswith(BUILD_INPUTS):
            digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def binder_env(venv: Path, home: Path) -> dict[str, str]:
    """The environment repo2docker's build and server would have: the venv first on PATH, a home of its
    own; pip's and npm's caches stay where they are (no need to download every wheel again)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(
        PATH=f"{venv / 'bin'}:{env['PATH']}",
        HOME=str(home),
        PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
        npm_config_cache=os.environ.get("npm_config_cache", str(Path.home() / ".npm")),
        # requirements.txt names PyTorch's CPU index, which this machine cannot reach: fail each lookup at
        # once instead of retrying it for every package (torch 2.13.0+cpu comes from the local wheel dir).
        PIP_RETRIES="0",
    )
    return env


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> str:
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out.stdout + out.stderr


def build(root: Path) -> tuple[Path, Path, dict[str, str]]:
    """A copy of the repository at `root`/repo, with the binder environment built for it in `root`/venv
    (HOME `root`/home) -> (repo, venv, env)."""
    repo, venv, home = checkout(root / "repo"), root / "venv", root / "home"
    home.mkdir(exist_ok=True)
    version = (repo / "binder" / "runtime.txt").read_text().strip().removeprefix("python-")
    python = shutil.which(f"python{version}")
    assert python, f"binder/runtime.txt asks for Python {version}, which is not on PATH here"
    env = binder_env(venv, home)
    run([python, "-m", "venv", str(venv)], repo, env, 120)
    install_requirements(repo, venv, env)
    run(["bash", "binder/postBuild"], repo, env, 900)
    return repo, venv, env


def install_requirements(repo: Path, venv: Path, env: dict[str, str]) -> None:
    """`binder/requirements.txt` into `venv`: by the suite's own uv from its cache, offline (the venv `make`
    built holds every pinned wheel, so this takes seconds: pip, as repo2docker runs it, downloads them all again,
    ~8 min on 2 cores); by pip, as repo2docker does, when the cache lacks one. The same file, the same pins."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is not None:
        links = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True
        ).stdout.split()
        # --compile-bytecode: pip (repo2docker's) writes .pyc at install, uv only when asked
        cmd = [uv, "pip", "install", "-q", "--offline", "--compile-bytecode", "--python", str(venv / "bin" / "python")]
        cmd += [arg for link in links for arg in ("--find-links", link)]
        # (HOME is the build's own: uv's cache is found where the suite's uv keeps it)
        cache = {"UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR", str(Path.home() / ".cache" / "uv"))}
        done = subprocess.run(
            [*cmd, "-r", "binder/requirements.txt"], cwd=repo, env={**env, **cache}, capture_output=True
        )
        if done.returncode == 0:
            return
    run(["python", "-m", "pip", "install", "--quiet", "-r", "binder/requirements.txt"], repo, env, 1500)


@contextlib.contextmanager
def cached_build() -> Iterator[tuple[Path, Path, dict[str, str]]]:
    """build() once per build key (see the module's docstring); a hit re-copies the repository's files.
    Holds a lock on the entry while the test uses it (other checkouts on this machine share the cache);
    entries unused for a week go."""
    cache = Path(os.environ.get("FORGE_NB_TEST_CACHE", Path.home() / ".cache" / "forge_nb")) / "test-binder"
    cache.mkdir(parents=True, exist_ok=True)
    key = build_key()
    with open(cache / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in cache.glob("*.lock"):
            if stale.stem != key and time.time() - stale.stat().st_mtime > 7 * 86400:
                shutil.rmtree(cache / stale.stem, ignore_errors=True)
                stale.unlink(missing_ok=True)
        entry = cache / key
        if os.environ.get("FORGE_NB_BINDER_REBUILD") == "1" or not (entry / "built").exists():
            shutil.rmtree(entry, ignore_errors=True)
            entry.mkdir()
            built = build(entry)
            (entry / "built").touch()  # the checks below run on every use, hit or not
            yield built
        else:
            repo, venv, home = checkout(entry / "repo"), entry / "venv", entry / "home"
            yield repo, venv, binder_env(venv, home)


def test_binder_files_build_an_environment_that_runs_tutorial_01(tmp_path):
    with cached_build() as (repo, venv, env):
        check_environment_and_run_tutorial(repo, venv, env, tmp_path)
    assert wait_no_children() == []


def check_environment_and_run_tutorial(repo: Path, venv: Path, env: dict[str, str], tmp_path: Path) -> None:
    # The kernel is this environment's Python, JupyterLab sees the forge sidebar, and no vLLM is in it.
    listed = subprocess.run(
        ["python", "-m", "jupyter", "kernelspec", "list", "--json"], cwd=repo, env=env, capture_output=True
    )
    specs = json.loads(listed.stdout)
    assert Path(specs["kernelspecs"]["python3"]["resource_dir"]).is_relative_to(venv)
    assert "jupyterlab-forge" in run(["python", "-m", "jupyter", "labextension", "list"], repo, env, 120)
    run(["python", "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is not None)"], repo, env, 60)

    # As under nbval: the suite's values in the tutorial's parameters cell (tests/notebook/parameters.py).
    notebook = repo / "notebooks" / f"suite_{TUTORIAL}"
    nbformat.write(parameters.shortened(nbformat.read(repo / "notebooks" / TUTORIAL, as_version=4), TUTORIAL), notebook)
    executed = tmp_path / "01_executed.ipynb"
    run(
        [
            "python",
            "-m",
            "jupyter",
            "nbconvert",
            "--to",
            "notebook",
            "--execute",
            "--ExecutePreprocessor.timeout=600",
            f"--output={executed}",
            notebook.name,
        ],
        repo / "notebooks",
        env,
        900,
    )
    cells = nbformat.read(executed, as_version=4).cells
    errors = [o for c in cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == [] and all(c.execution_count for c in cells if c.cell_type == "code")
