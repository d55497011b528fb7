"""Export a session (or a config) as a standalone run: a script plus an sbatch file, no notebook.

`export_session(s, PATH)` writes into PATH:

- ``config.yaml``: the session's configuration, as it is run (``mesh.kind: local`` -- the script runs
  on the node Slurm gives it -- and ``model.path`` at the checkpoint when the policy has trained).
- ``checkpoint/``: the trainer's current weights and the tokenizer (HF format), when version > 0.
- ``reward.py``, ``loss.py``: the live reward and loss sources (each with the name it calls).
- ``manifest.json``: where everything came from (versions, what was changed in the config).
- ``run.py``: ``python run.py [--steps N]`` starts the session, makes that reward and loss live, steps,
  writes ``metrics.csv`` and ``result.json`` (the config it ran, live-code versions, final numbers).
- ``run.sbatch``: the Slurm options of ``config.slurm`` around ``python run.py``.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from forge_nb.config import Config
from forge_nb.live.capture import LiveCode

if TYPE_CHECKING:
    from forge_nb.session import Session

RUN_SCRIPT = '''"""Reproduce an exported forge_nb session without a notebook: python run.py [--steps N]."""

import argparse
import json
from pathlib import Path

import forge_nb
from forge_nb.config import Config
from forge_nb.live.capture import LiveCode

HERE = Path(__file__).resolve().parent


def live_code(kind: str, manifest: dict) -> LiveCode | None:
    """The exported reward or loss (None: the config's built-in v0 is what was live)."""
    meta = manifest[kind]
    if meta["builtin"]:
        return None
    source = (HERE / f"{kind}.py").read_text()
    return LiveCode(kind, meta["name"], source, f"{kind}.py (notebook v{meta['version']})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args()
    manifest = json.loads((HERE / "manifest.json").read_text())
    config = Config.from_yaml(HERE / "config.yaml")
    with forge_nb.up(config) as s:
        versions = {}
        for kind, make_live in (("reward", s.set_reward), ("loss", s.set_loss)):
            code = live_code(kind, manifest)
            versions[kind] = make_live(code) if code else 0
        heldout_before = s.evaluate()["heldout_accuracy"]
        df = s.step(args.steps, progress=False)
        df.to_csv(HERE / "metrics.csv")
        result = {
            "steps": len(df),
            "policy_version": int(df.policy_version.iloc[-1]) if len(df) else 0,
            "config": s.config.to_dict(),
            "reward_source": (HERE / "reward.py").read_text() if versions["reward"] else None,
            "loss_source": (HERE / "loss.py").read_text() if versions["loss"] else None,
            "live_versions": versions,
            "mean_reward_last_10": float(df.mean_reward.tail(10).mean()) if len(df) else None,
            "heldout_accuracy": {"before": heldout_before, "after": s.evaluate()["heldout_accuracy"]},
        }
    (HERE / "result.json").write_text(json.dumps(result, indent=2))
    print(f"forge_nb: {result['steps']} steps, held-out accuracy {heldout_before:.3f} -> "
          f"{result['heldout_accuracy']['after']:.3f}; wrote {HERE / 'result.json'}")


if __name__ == "__main__":
    main()
'''


def export_session(session: Session, path: str | Path, steps: int = 100) -> Path:
    """Write `session`'s config, current weights and live reward/loss as a runnable bundle -> PATH."""
    out = _prepare(path)
    config, changed = session.config, {}
    if session.trainer_version > 0:
        checkpoint = out / "checkpoint"
        session.save_checkpoint(checkpoint)
        changed["model.path"] = [config.model.path, str(checkpoint)]
    live = {kind: session.registry.live(kind) for kind in ("reward", "loss")}
    return _write(out, config, changed, {k: (r.version, r.code) for k, r in live.items()}, steps,
                  {"policy_version": session.trainer_version, "steps": session.step_count})  # fmt: skip


def export_config(config: Config, path: str | Path, steps: int = 100) -> Path:
    """A bundle that runs `config` from scratch with its built-in reward and loss -> PATH."""
    from forge_nb.live.builtin import builtin_loss, builtin_reward

    live = {"reward": (0, builtin_reward(config.task, config.seed)), "loss": (0, builtin_loss(config.algorithm))}
    return _write(_prepare(path), config, {}, live, steps, {"policy_version": 0, "steps": 0})


def _prepare(path: str | Path) -> Path:
    out = Path(path).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    return out


def _write(out: Path, config: Config, changed: dict, live: dict[str, tuple[int, LiveCode]], steps: int,
           origin: dict) -> Path:  # fmt: skip
    if config.mesh.kind != "local":
        changed["mesh.kind"] = [config.mesh.kind, "local"]
    if config.engine.name == "auto":  # pin what served the notebook ($FORGE_NB_ENGINE, vLLM installed or not)
        changed["engine.name"] = ["auto", config.engine.resolved_name]
    run_config = config.updated({name: new for name, (_, new) in changed.items()})
    (out / "config.yaml").write_text(yaml.safe_dump(run_config.to_dict(), sort_keys=False))
    manifest = {"origin": origin, "config_changes": changed}
    for kind, (version, code) in live.items():
        (out / f"{kind}.py").write_text(code.source)
        manifest[kind] = {"version": version, "name": code.name, "builtin": version == 0, "origin": code.origin}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    (out / "run.py").write_text(RUN_SCRIPT.replace("default=STEPS", f"default={steps}"))
    (out / "run.sbatch").write_text(sbatch_script(run_config, out))
    return out


def run_hint(out: Path) -> str:
    """How to run an exported bundle, for the line printed after an export."""
    return f"exported to {out}; run it with `sbatch {out / 'run.sbatch'}` or `python {out / 'run.py'}`"


def sbatch_script(config: Config, out: Path) -> str:
    """#SBATCH lines from `config.slurm` (one node: the exported run uses a local mesh there)."""
    s = config.slurm
    lines = ["#!/bin/bash", "#SBATCH --job-name=forge_nb_export", "#SBATCH --nodes=1",
             f"#SBATCH --output={out / 'run_%j.out'}", f"#SBATCH --chdir={out}"]  # fmt: skip
    options = {"--time": s.time_limit, "--partition": s.partition, "--account": s.account, "--qos": s.qos,
               "--gpus-per-node": s.gpus_per_node or ""}  # fmt: skip
    lines += [f"#SBATCH {flag}={value}" for flag, value in options.items() if value]
    lines += [f"#SBATCH {arg}" for arg in s.sbatch_args]
    lines += ["", "set -euo pipefail", f"exec {shlex.quote(sys.executable)} {shlex.quote(str(out / 'run.py'))}", ""]
    return "\n".join(lines)
