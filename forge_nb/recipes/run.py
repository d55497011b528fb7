"""Reproduce an exported forge_nb session without a notebook: ``python run.py [--steps N]``.

`forge_nb.export` copies this file, unchanged, next to what it reads: ``config.yaml`` (the session's
configuration), ``manifest.json`` (versions, steps), ``reward.py`` and ``loss.py`` (the live code)
and, once the policy has trained, ``checkpoint/`` (its weights; ``config.yaml`` points there). It
writes ``metrics.csv`` (one row per step) and ``result.json`` beside them.

It is also the GRPO loop of forge_nb, top to bottom: each step generates G samples for each of P
prompts, scores them with the live reward, takes one optimizer step with the live loss on the
group-relative advantages, and refreshes the generator with the new weights.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd

import forge_nb
from forge_nb.config import Config
from forge_nb.live.capture import LiveCode

HERE = Path(__file__).resolve().parent


def live_code(kind: str, manifest: dict) -> LiveCode | None:
    """The exported reward or loss (None: the config's built-in v0 was live)."""
    meta = manifest[kind]
    if meta["builtin"]:
        return None
    source = (HERE / f"{kind}.py").read_text()
    return LiveCode(kind, meta["name"], source, f"{kind}.py (notebook v{meta['version']})")


def main(argv: list[str] | None = None) -> dict:
    manifest = json.loads((HERE / "manifest.json").read_text())
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=manifest["steps"], help="training steps (default: as exported)")
    args = parser.parse_args(argv)
    config = Config.from_yaml(HERE / "config.yaml")

    rows = []
    with forge_nb.up(config) as s:  # generator, trainer and reward actors, each in its own proc
        live = {"reward": live_code("reward", manifest), "loss": live_code("loss", manifest)}
        versions = {
            "reward": s.set_reward(live["reward"]) if live["reward"] else 0,  # validated, then shipped
            "loss": s.set_loss(live["loss"]) if live["loss"] else 0,
        }
        heldout_before = s.evaluate()["heldout_accuracy"]
        for _ in range(args.steps):
            start = time.perf_counter()
            rollout = s.rollout()  # P prompts x G samples, rewards, group-relative advantages
            train = s.train(rollout)  # one optimizer step; the trainer publishes policy version v + 1
            refresh = s.sync()  # the generator loads v + 1 (shared memory here, Monarch RDMA across hosts)
            rows.append(
                {
                    "step": s.step_count,
                    "policy_version": train["policy_version"],
                    "mean_reward": rollout.mean_reward,
                    "accuracy": rollout.accuracy,
                    "loss": train["loss"],
                    "grad_norm": train["grad_norm"],
                    "tokens_per_s": rollout.tokens_per_s,
                    "refresh_gbps": refresh["gbps"],
                    "step_s": time.perf_counter() - start,
                }
            )
        heldout_after = s.evaluate()["heldout_accuracy"]
        config_run = s.config.to_dict()

    metrics = pd.DataFrame(
        rows,
        columns=[
            "step",
            "policy_version",
            "mean_reward",
            "accuracy",
            "loss",
            "grad_norm",
            "tokens_per_s",
            "refresh_gbps",
            "step_s",
        ],
    )
    metrics.to_csv(HERE / "metrics.csv", index=False)
    result = {
        "steps": len(metrics),
        "policy_version": int(metrics.policy_version.iloc[-1]) if len(metrics) else 0,
        "config": config_run,
        "reward_source": live["reward"].source if live["reward"] else None,
        "loss_source": live["loss"].source if live["loss"] else None,
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
