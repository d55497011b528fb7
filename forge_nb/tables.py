"""pandas tables of a session's samples, readable at a glance (`Session.samples`)."""

from __future__ import annotations

import pandas as pd

from forge_nb.metrics import MetricsStream
from forge_nb.rl.replay import ReplayBuffer
from forge_nb.run.rollout_log import RolloutLog
from forge_nb.state import SessionError

SAMPLE_COLUMNS = [
    "sample_id",
    "prompt",
    "completion",
    "target",
    "reward",
    "advantage",
    "finish_reason",
    "policy_version",
    "reward_version",
    "loss_version",
    "reward_error",
]
AGENT_COLUMNS = ["turns", "segment", "tool_calls", "tool_errors", "trained_tokens"]  # segment: "k/n" if split


def samples_table(buffer: ReplayBuffer, n: int = 16) -> pd.DataFrame:
    """The last `n` samples: prompt (as the model saw it), completion, target, the weighted reward
    and each reward's own score (``reward/<name>``, when several rewards are live: with one, it is `reward`), for
    trajectories their model calls (`turns`), tool calls and errors and trained (policy) tokens, advantage, and the
    versions that made them."""
    df = buffer.to_pandas(n)
    if df.empty:
        return pd.DataFrame(columns=SAMPLE_COLUMNS).set_index("sample_id")
    members = sorted(c for c in df.columns if c.startswith("reward/"))
    if members == ["reward/reward"]:  # the one live reward: its score is the `reward` column
        members = []
    agent = [c for c in AGENT_COLUMNS if c in df.columns]  # present once an agent rollout made samples
    columns = SAMPLE_COLUMNS[:5] + members + agent + SAMPLE_COLUMNS[5:]
    return df[columns].set_index("sample_id").round({c: 3 for c in ["reward", "advantage", *members]})


def samples(
    buffer: ReplayBuffer, log: RolloutLog | None, n: int, step: int | None, prompt_id: str | None
) -> pd.DataFrame:
    """`samples_table` of the last `n`; with `step` or `prompt_id`, every sample of that trained step /
    of that prompt so far, from the rollout log (tokens and logprobs too)."""
    if step is None and prompt_id is None:
        return samples_table(buffer, n)
    if log is None:
        raise SessionError("forge_nb: the rollout log is off (log.samples=False): only s.samples(n)")
    return log.read(step=step, prompt_id=prompt_id)


def staleness(metrics: MetricsStream) -> pd.Series:
    """Trained batches by staleness (trainer version - generating version), from the step rows."""
    steps = metrics.to_pandas("step")
    return steps.staleness.value_counts().sort_index() if not steps.empty else pd.Series(dtype=int)


POLICY_COLUMNS = ["kind", "version", "status", "change", "created", "refresh_s", "bytes", "transport"]


def policy_versions(metrics: MetricsStream, served: int) -> pd.DataFrame:
    """Every policy version the generators were refreshed to, from the "sync" rows (refreshes that loaded one):
    what asked for it (`change`: the session's step or sync, a Tinker client's save_weights_for_sampler, ...),
    when, its seconds and bytes; `status` "served" for the one served now, "retired" before it."""
    rows = [
        {
            "kind": "policy",
            "version": r["version"],
            "status": "served" if r["version"] == served else "retired",
            "change": r.get("source", "session"),
            "created": pd.Timestamp(r["time"], unit="s"),
            "refresh_s": r.get("total_seconds"),
            "bytes": r.get("bytes"),
            "transport": r.get("transport"),
        }
        for r in metrics.rows("sync")
        if not r.get("skipped")
    ]
    return pd.DataFrame(rows, columns=POLICY_COLUMNS)
