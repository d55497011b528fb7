"""Reproduce an exported forge_nb session without a notebook: ``python run.py [--steps N]``.

`forge_nb.export` copies this file, unchanged, next to what it reads: ``config.yaml`` (the session's
configuration), ``manifest.json`` (versions, weights, steps), ``reward*.py`` and ``loss.py`` (the live
code) and, once the policy has trained, ``checkpoint/`` (its weights; ``config.yaml`` points there).
It writes ``metrics.csv`` (one row per step: `forge_nb.step.StepRow`) and ``result.json`` beside them.

Each step is the notebook's step, `forge_nb.step.sync_step` (read it top to bottom): G samples for
each of P prompts, scored by the live reward, an optimizer step (or `algorithm.epochs` x
`algorithm.mini_batches`) with the live loss on the group-relative advantages, and the generator refreshed
with the new weights.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import forge_nb
from forge_nb.config import Config
from forge_nb.live.builtin import builtin_loss, builtin_reward
from forge_nb.live.capture import LiveCode

HERE = Path(__file__).resolve().parent


def make_live(s, kind: str, manifest: dict) -> dict[str, str]:
    """Make the exported reward set (or loss) live in session `s` -> {member: its source}. A member
    still at the config's built-in code with weight 1 is live already, unless this forge_nb writes that
    built-in otherwise (a bundle exported by an older one runs the code it exported)."""
    sources, meta = {}, manifest[kind]
    builtin = (
        builtin_loss(s.config.algorithm, s.config.engine.max_tokens)
        if kind == "loss"
        else builtin_reward(s.config.task)
    )
    for name, member in meta["members"].items():
        source = (HERE / member["file"]).read_text()
        sources[name] = source
        if member["builtin"] and member["weight"] == 1.0 and source == builtin.source:
            continue
        origin = f"{member['file']} (notebook v{meta['version']})"
        code = LiveCode(
            kind, member["function"], source, origin, paths=tuple(member["paths"]), reload=tuple(member["reload"])
        )
        if kind == "loss":
            s.set_loss(code)
        else:
            s.set_reward(code, name=name, weight=member["weight"])
    if kind == "reward" and "reward" not in meta["members"]:
        s.remove_reward("reward")  # the notebook had replaced the built-in member by others
    return sources


def main(argv: list[str] | None = None) -> dict:
    manifest = json.loads((HERE / "manifest.json").read_text())
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=manifest["steps"], help="training steps (default: as exported)")
    parser.add_argument(
        "--hosts", default="", help="tls://HOST:PORT,... of a worker on each node (run.sbatch of a multi-node job)"
    )
    parser.add_argument("--credentials", default="", help="the CA folder the workers hold (mesh.credentials)")
    args = parser.parse_args(argv)
    config = Config.from_yaml(HERE / "config.yaml")
    if args.hosts:  # the job's nodes: the same shape (mesh.trainer_hosts, ...) on the workers started there
        hosts = {"mesh.kind": "hosts", "mesh.hosts": args.hosts.split(",")}
        config = config.updated({**hosts, "mesh.credentials": args.credentials})

    with forge_nb.up(config) as s:  # generator, trainer and reward actors, each in its own proc
        sources = {kind: make_live(s, kind, manifest) for kind in ("reward", "loss")}  # validated, then shipped
        versions = {kind: s.registry.live(kind).version for kind in ("reward", "loss")}
        heldout_before = s.evaluate()["heldout_accuracy"]
        metrics = s.step(args.steps).reset_index()  # rollout -> score -> advantages -> train -> sync, N times
        heldout_after = s.evaluate()["heldout_accuracy"]
        config_run = s.config.to_dict()

    metrics.to_csv(HERE / "metrics.csv", index=False)
    result = {
        "steps": len(metrics),
        "policy_version": int(metrics.policy_version.iloc[-1]) if len(metrics) else 0,
        "config": config_run,
        "reward_sources": sources["reward"],
        "loss_source": sources["loss"]["loss"],
        "live_versions": versions,
        "mean_reward_last_10": float(metrics.mean_reward.tail(10).mean()) if len(metrics) else None,
        "heldout_accuracy": {"before": heldout_before, "after": heldout_after},
    }
    (HERE / "result.json").write_text(json.dumps(result, indent=2))
    print(
        f"forge_nb: {result['steps']} steps, held-out accuracy {heldout_before:.3f} -> {heldout_after:.3f}; "
        f"wrote {HERE / 'result.json'}"
    )
    return result


if __name__ == "__main__":
    main()
