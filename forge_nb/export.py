"""Export a session (or a config) as a standalone run: a script plus an sbatch file, no notebook.

`Session.export(PATH)` (through `export_bundle`) writes into PATH:

- ``config.yaml``: the session's configuration, as it is run (``mesh.kind: local`` -- the script runs
  on the node Slurm gives it -- and ``model.path`` at the checkpoint when the policy has trained).
- ``checkpoint/``: the trainer's current weights and the tokenizer (HF format), when version > 0; with
  LoRA the adapter (peft's format) and the merged model in ``checkpoint/merged/``.
- ``reward.py`` (and ``reward_<name>.py`` for each other live reward), ``loss.py``: the live sources.
- ``manifest.json``: where everything came from (versions, what was changed in the config), and the
  number of steps the exported run takes.
- ``run.py``: `forge_nb/recipes/run.py`, copied verbatim: ``python run.py [--steps N]`` starts the
  session, makes that reward and loss live, steps, writes ``metrics.csv`` and ``result.json`` (the
  config it ran, live-code versions, final numbers).
- ``run.sbatch``: the Slurm options of ``config.slurm`` around ``python3 run.py``, with the job's own Python:
  ``$FORGE_NB_PYTHON`` if set, else ``python3`` on the job's PATH (sbatch gives the job the submitting
  shell's environment, Slurm's ``--export=ALL`` default: activate the environment that has forge_nb --
  a venv, conda, a module -- before ``sbatch run.sbatch``), never this machine's interpreter. A job of several
  nodes (``slurm.nodes``) makes a CA of its own in the bundle's folder, starts a forge_nb worker holding it on
  each node (``srun``) and runs ``run.py --hosts --credentials`` with them: the session's shape
  (``mesh.trainer_hosts``, ``mesh.generator_hosts``) over the job's nodes, over mutual TLS.
"""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path

import yaml

from forge_nb.config import Config
from forge_nb.launch.placement import slurm_nodes
from forge_nb.live.builtin import builtin_loss, builtin_reward
from forge_nb.live.registry import Member
from forge_nb.paths import as_typed

RUN_SCRIPT = Path(__file__).parent / "recipes" / "run.py"
PYTHON_LINES = [
    "# The job's Python: $FORGE_NB_PYTHON, else python3 on the job's PATH. sbatch hands the job the environment",
    "# it was run from: activate the one with forge_nb (venv, conda, module) before `sbatch run.sbatch`.",
    'PYTHON="${FORGE_NB_PYTHON:-python3}"',
    "export PYTHON",
]


def export_bundle(
    path: str | Path,
    config: Config,
    live: dict[str, tuple[int, dict[str, Member]]],
    steps: int,
    origin: dict,
    save_checkpoint: Callable[[Path], int] | None = None,
) -> Path:
    """Write a runnable bundle into `path` -> the directory: `config` as it is run, the `live`
    reward set and loss ({kind: (version, members)}), the number of `steps` the exported run takes,
    and where it came from (`origin`). `save_checkpoint(dir)`, when given, writes the current
    weights there and the exported config points `model.path` at them."""
    out, changed = Path(path).expanduser().resolve(), {}
    out.mkdir(parents=True, exist_ok=True)
    if save_checkpoint is not None:
        checkpoint = out / "checkpoint"
        save_checkpoint(checkpoint)
        # A LoRA checkpoint is the adapter, with the merged model beside it: the run goes on from the latter.
        weights = checkpoint / "merged" if config.lora.enabled else checkpoint
        changed["model.path"] = [config.model.path, str(weights)]
    if config.mesh.kind != "local":
        changed["mesh.kind"] = [config.mesh.kind, "local"]
    if config.engine.name == "auto":  # pin what served the notebook ($FORGE_NB_ENGINE, vLLM installed or not)
        changed["engine.name"] = ["auto", config.engine_name()]
    run_config = config.updated({name: new for name, (_, new) in changed.items()})
    (out / "config.yaml").write_text(yaml.safe_dump(run_config.to_dict(), sort_keys=False))
    manifest = {"origin": origin, "steps": steps, "config_changes": changed}
    for kind, (version, members) in live.items():
        manifest[kind] = {"version": version, "members": {}}
        for name, member in members.items():
            file = f"{kind}.py" if name == kind else f"{kind}_{name}.py"
            (out / file).write_text(member.code.source)
            manifest[kind]["members"][name] = {
                "file": file,
                "function": member.code.name,
                "weight": member.weight,
                "builtin": member.code.origin.startswith("built-in"),
                "origin": member.code.origin,
                "paths": list(member.code.paths),  # where the user's own modules it imports live
                "reload": list(member.code.reload),
            }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    shutil.copyfile(RUN_SCRIPT, out / "run.py")
    (out / "run.sbatch").write_text(sbatch_script(run_config, out))
    return out


def export_config(config: Config, path: str | Path, steps: int = 100) -> Path:
    """A bundle that runs `config` from scratch with its built-in reward and loss -> PATH."""
    loss = builtin_loss(config.algorithm, config.engine.max_tokens)
    live = {"reward": (0, {"reward": Member(builtin_reward(config.task))}), "loss": (0, {"loss": Member(loss)})}
    return export_bundle(path, config, live, steps, {"policy_version": 0, "steps": 0})


def run_hint(out: Path) -> str:
    """How to run an exported bundle, for the line printed after an export: its paths as typed from the
    current folder (relative inside it, else with ~ for the home folder), as a user would type them."""
    where = as_typed(out)
    return f"exported to {where}; run it with `sbatch {where / 'run.sbatch'}` or `python {where / 'run.py'}`"


def sbatch_script(config: Config, out: Path) -> str:
    """#SBATCH lines from `config.slurm` around run.py: on one node it runs a local mesh there; on
    several, a worker on each node and the run as a hosts mesh over them (`_multi_node`)."""
    s = config.slurm
    nodes = slurm_nodes(config)
    lines = [
        "#!/bin/bash",
        "#SBATCH --job-name=forge_nb_export",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --output={out / 'run_%j.out'}",
        f"#SBATCH --chdir={out}",
    ]
    options = {
        "--time": s.time_limit,
        "--partition": s.partition,
        "--account": s.account,
        "--qos": s.qos,
        "--gpus-per-node": s.gpus_per_node or "",
    }
    lines += [f"#SBATCH {flag}={value}" for flag, value in options.items() if value]
    lines += [f"#SBATCH {arg}" for arg in s.sbatch_args]
    python, run = '"$PYTHON"', shlex.quote(str(out / "run.py"))
    lines += ["", "set -euo pipefail", *PYTHON_LINES]
    lines += _multi_node(python, run) if nodes > 1 else [f"exec {python} {run}"]
    return "\n".join([*lines, ""])


def _multi_node(python: str, run: str) -> list[str]:
    """The job's own CA (in the bundle's folder, which every node sees: ``--chdir``), a forge_nb worker holding
    it on every node of the job (one srun step, at the node's name and a port derived from the job id), then
    run.py on the first node with all of them as its hosts and the same CA; the CA goes when the job ends."""
    # PYTHON and CREDENTIALS: exported, srun passes them
    worker = f'exec {python} -m forge_nb.launch.worker tls://$(hostname):$PORT --credentials "$CREDENTIALS"'
    return [
        "export PORT=$((20000 + SLURM_JOB_ID % 20000))",
        'export CREDENTIALS="$PWD/credentials-$SLURM_JOB_ID"  # this job\'s CA: its ca.key is the secret (0600)',
        f'{python} -m forge_nb.launch.credentials new "$CREDENTIALS" > /dev/null',
        f"srun --ntasks-per-node=1 sh -c {shlex.quote(worker)} &",
        "WORKERS=$!",
        """trap 'kill $WORKERS 2>/dev/null || true; rm -rf "$CREDENTIALS"' EXIT""",
        'HOSTS=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s|.*|tls://&:$PORT|" | paste -sd, -)',
        f'{python} {run} --hosts "$HOSTS" --credentials "$CREDENTIALS"',
    ]
