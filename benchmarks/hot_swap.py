"""Hot-swap latency on the local mesh: validation time in the kernel, and the time from
`set_reward` / `set_loss` being called to every actor reporting the new version.

    python benchmarks/hot_swap.py [--swaps 20] [--reward-procs 2]

`set_reward` returns only once every reward actor has compiled the new version, so "swap" below is
the whole call minus validation: ship the source, compile it in each actor, acknowledge.
"""

from __future__ import annotations

import argparse
import statistics
import time

from forge_nb.session import Session

REWARD = "def reward(prompt, completion, target, **context):\n    return float(completion.strip() == target) + {k}\n"
LOSS = (
    "import torch\n\n"
    "def loss(logprobs, old_logprobs, advantages, mask):\n"
    "    ratio = torch.exp(logprobs - old_logprobs)\n"
    "    return -(ratio * advantages[:, None] * mask).sum() / mask.sum() * {k}\n"
)


def measure(session, kind: str, swaps: int) -> list[dict]:
    rows = []
    for k in range(1, swaps + 1):
        source = (REWARD if kind == "reward" else LOSS).format(k=k if kind == "loss" else 0.0)
        setter = session.set_reward if kind == "reward" else session.set_loss
        start = time.perf_counter()
        version = setter(source)
        returned = time.perf_counter()
        if kind == "reward":
            live = set(session.fleet.rewards.version_live.call().get().values())
        else:
            live = {session.registry.live("loss").version}
        assert live == {version}, (live, version)
        validation = session.registry.live(kind).validation["seconds"]
        rows.append({"total_s": returned - start, "validation_s": validation, "swap_s": returned - start - validation})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--reward-procs", type=int, default=2)
    args = parser.parse_args()
    session = Session.up(reward_procs=args.reward_procs, engine="torch")
    try:
        session.step(2)  # probe samples come from the buffer, as in a running session
        results = {kind: measure(session, kind, args.swaps) for kind in ("reward", "loss")}
    finally:
        session.down()
    print(
        f"\nhot-swap on the local mesh, {args.reward_procs} reward procs, probe of "
        f"{session.config.live.probe_size} recent samples, {args.swaps} swaps each (ms)\n"
    )
    print(f"{'kind':<8}{'validate p50':>14}{'swap p50':>11}{'swap max':>11}{'total p50':>12}")
    for kind, rows in results.items():
        p50 = {k: statistics.median(r[k] for r in rows) * 1e3 for k in rows[0]}
        worst = max(r["swap_s"] for r in rows) * 1e3
        print(f"{kind:<8}{p50['validation_s']:>14.2f}{p50['swap_s']:>11.2f}{worst:>11.2f}{p50['total_s']:>12.2f}")
    print("\ngoal: swap under 100 ms")


if __name__ == "__main__":
    main()
