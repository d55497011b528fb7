"""binder/ alone builds an environment that runs the quickstart: a copy of the repository (what a clone has),
a fresh virtualenv of binder/runtime.txt's Python, `pip install -r binder/requirements.txt` from the copy's root,
then `binder/postBuild`, as repo2docker does; then tutorial 01 executes in that environment's own kernel
(`jupyter nbconvert --execute`, which stops at the first cell that raises)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from tests.conftest import wait_no_children

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = "01_quickstart.ipynb"  # in notebooks/, where it runs


def checkout(dest: Path) -> Path:
    """The repository's files as a clone of this working tree would have them: tracked and untracked
    files, less what .gitignore ignores (no .venv, no built extension, no node_modules)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


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


def test_binder_files_build_an_environment_that_runs_tutorial_01(tmp_path):
    repo, venv, home = checkout(tmp_path / "repo"), tmp_path / "venv", tmp_path / "home"
    home.mkdir()
    version = (repo / "binder" / "runtime.txt").read_text().strip().removeprefix("python-")
    python = shutil.which(f"python{version}")
    assert python, f"binder/runtime.txt asks for Python {version}, which is not on PATH here"
    env = binder_env(venv, home)
    run([python, "-m", "venv", str(venv)], repo, env, 120)
    run(["python", "-m", "pip", "install", "--quiet", "-r", "binder/requirements.txt"], repo, env, 1500)
    run(["bash", "binder/postBuild"], repo, env, 900)

    # The kernel is this environment's Python, JupyterLab sees the forge sidebar, and no vLLM is in it.
    listed = subprocess.run(
        ["python", "-m", "jupyter", "kernelspec", "list", "--json"], cwd=repo, env=env, capture_output=True
    )
    specs = json.loads(listed.stdout)
    assert Path(specs["kernelspecs"]["python3"]["resource_dir"]).is_relative_to(venv)
    assert "jupyterlab-forge" in run(["python", "-m", "jupyter", "labextension", "list"], repo, env, 120)
    run(["python", "-c", "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is not None)"], repo, env, 60)

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
            TUTORIAL,
        ],
        repo / "notebooks",
        env,
        900,
    )
    cells = nbformat.read(executed, as_version=4).cells
    errors = [o for c in cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == [] and all(c.execution_count for c in cells if c.cell_type == "code")
    assert wait_no_children() == []
