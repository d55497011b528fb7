"""Export: a session becomes run.py + run.sbatch; the sbatch file runs under a real local Slurm."""

from __future__ import annotations

import json
import sys
import time

import pytest
import yaml

from forge_nb.config import Config
from forge_nb.export import RUN_SCRIPT, export_config, sbatch_script
from forge_nb.session import Session
from tests.conftest import wait_no_children

REWARD = '''
import re

def reward(prompt, completion, target, **context):
    """Exact answer 1.0; a right first digit 0.5."""
    digits = re.sub(r"[^0-9]", "", completion)
    return 1.0 if digits == target else 0.5 * (digits[:1] == target[:1])
'''


def test_sbatch_file_carries_the_slurm_options(tmp_path):
    config = Config().updated(
        {
            "slurm": {
                "partition": "gpu",
                "time_limit": "02:00:00",
                "account": "rl",
                "qos": "high",
                "gpus_per_node": 8,
                "sbatch_args": ["--mem=64G"],
            }
        }
    )
    text = sbatch_script(config, tmp_path)
    for line in (
        "--partition=gpu",
        "--time=02:00:00",
        "--account=rl",
        "--qos=high",
        "--gpus-per-node=8",
        "#SBATCH --mem=64G",
        f"--chdir={tmp_path}",
        "--nodes=1",
    ):
        assert line in text
    assert text.rstrip().endswith(f"{tmp_path / 'run.py'}")
    # the job's own Python (its environment's, or $FORGE_NB_PYTHON), not this machine's interpreter
    assert 'PYTHON="${FORGE_NB_PYTHON:-python3}"' in text and sys.executable not in text


def test_export_of_a_config_pins_the_engine_and_runs_locally(tmp_path):
    out = export_config(Config().updated({"mesh.kind": "slurm", "engine.name": "auto", "lr": 1e-4}), tmp_path, 7)
    assert {p.name for p in out.iterdir()} == {
        "config.yaml",
        "manifest.json",
        "reward.py",
        "loss.py",
        "run.py",
        "run.sbatch",
    }
    written = Config.from_yaml(out / "config.yaml")
    assert written.mesh.kind == "local" and written.engine.name == "torch"  # the suite's $FORGE_NB_ENGINE
    assert written.algorithm.lr == 1e-4
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["reward"]["members"]["reward"]["builtin"]
    assert manifest["config_changes"]["mesh.kind"] == ["slurm", "local"]
    assert manifest["steps"] == 7
    assert (out / "run.py").read_text() == RUN_SCRIPT.read_text()  # copied verbatim


@pytest.mark.slow
def test_exported_session_runs_to_completion_under_slurm_and_matches_the_notebook(slurm, tmp_path):
    s = Session.up(prompts_per_step=4, group_size=4, threads_per_proc=1, engine="torch", lr=1e-3)
    try:
        assert s.set_reward(REWARD) == 1
        s.step(2)
        out = s.export(tmp_path / "bundle", steps=3)
        notebook = s.config.to_dict()
        live_reward = s.registry.live("reward").code.source
    finally:
        s.down()
    assert (out / "checkpoint" / "model.safetensors").is_file() and (out / "checkpoint" / "tokenizer.json").is_file()

    state = slurm.run_batch(out / "run.sbatch", timeout=300)
    log = next(out.glob("run_*.out")).read_text()
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, log[-3000:]

    result = json.loads((out / "result.json").read_text())
    expected = {**notebook, "model": {**notebook["model"], "path": str(out / "checkpoint")}}
    assert result["config"] == expected
    assert result["reward_sources"] == {"reward": live_reward} and result["live_versions"] == {"reward": 1, "loss": 0}
    assert result["steps"] == 3 and result["policy_version"] == 3
    assert yaml.safe_load((out / "config.yaml").read_text()) == expected
    time.sleep(0.5)
    assert slurm.live_steps() == []
    assert wait_no_children(exclude=slurm.daemons) == []


def test_the_printed_hint_gives_paths_as_typed_from_the_current_folder(tmp_path, monkeypatch):
    from forge_nb.export import run_hint

    monkeypatch.chdir(tmp_path)
    assert run_hint(tmp_path / "runs" / "exp1") == (
        "exported to runs/exp1; run it with `sbatch runs/exp1/run.sbatch` or `python runs/exp1/run.py`"
    )
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir("/")
    assert run_hint(tmp_path / "b").startswith("exported to ~/b;")
