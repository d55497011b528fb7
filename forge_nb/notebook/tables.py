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
    "policy_version",
    "reward_version",
    "loss_version",
    "reward_error",
]


def samples_table(session, n: int = 16) -> pd.DataFrame:
    """The last `n` samples: prompt, completion, target, reward, advantage and the versions that made them."""
    df = session.buffer.to_pandas(n)
    if df.empty:
        return pd.DataFrame(columns=SAMPLE_COLUMNS).set_index("sample_id")
    return df[SAMPLE_COLUMNS].set_index("sample_id").round({"reward": 3, "advantage": 3})
