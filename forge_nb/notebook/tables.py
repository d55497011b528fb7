"""pandas tables a notebook shows: recent samples, readable at a glance."""

from __future__ import annotations

import pandas as pd

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


def samples_table(session, n: int = 16) -> pd.DataFrame:
    """The last `n` samples: prompt (as the model saw it), completion, target, the weighted reward
    and each reward's own score (``reward/<name>``), advantage, and the versions that made them."""
    df = session.buffer.to_pandas(n)
    if df.empty:
        return pd.DataFrame(columns=SAMPLE_COLUMNS).set_index("sample_id")
    members = sorted(c for c in df.columns if c.startswith("reward/"))
    columns = SAMPLE_COLUMNS[:5] + members + SAMPLE_COLUMNS[5:]
    return df[columns].set_index("sample_id").round({c: 3 for c in ["reward", "advantage", *members]})
