"""Episodes: one scored completion with everything needed to train on it and to trace it back."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Episode:
    """One completion of one prompt, scored, with provenance.

    `group_id` ties the G samples of one prompt together (advantages are relative within it).
    `policy_version` is the weight version that generated it; `reward_version` and `loss_version`
    name the reward set and loss versions that scored / trained on it. `prompt` is the text the
    model saw (chat template applied); `reward` is the weighted sum of `rewards` (each member's own
    score, plus "overlong" when the DAPO penalty applies); `extras` are the dataset's other columns.
    """

    sample_id: int
    group_id: int
    prompt_id: str
    prompt: str
    completion: str
    target: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int
    reward: float = 0.0
    advantage: float = 0.0
    reward_version: int = 0
    loss_version: int = 0
    rewards: dict[str, float] = field(default_factory=dict)
    reward_error: str | None = None  # why the live reward failed on this sample (then it is not trained on)
    ref_logprobs: list[float] | None = None  # the frozen reference model's logprobs of completion_ids, if one runs
    extras: dict = field(default_factory=dict)
    # A multi-turn trajectory (`agents`): completion_ids are every token after the first prompt, and
    # completion_mask is 1 on the policy's own tokens, 0 on tool results, environment messages and
    # template glue (None: a single completion, every token the policy's). `turns`: one dict per model
    # call (text, tokens, reward, tool calls and errors, policy version) for tables and the explorer.
    completion_mask: list[int] | None = None
    turns: list[dict] | None = None
    # A trajectory whose calls did not all extend one conversation is several sequences: segment k of
    # `segments` (each trained as its own sequence, all with the trajectory's reward and advantage).
    segment: int = 0
    segments: int = 1

    @property
    def scored(self) -> bool:
        """Whether a reward scored it: its reward did not fail, and some member gave a score (TRL's
        "unscorable" sample, every member returning None, did not). Only scored samples are trained on and
        counted in a reward mean."""
        return self.reward_error is None and bool(self.rewards)

    @property
    def trained_tokens(self) -> int:
        """Tokens the loss sees: the policy's own."""
        return len(self.completion_ids) if self.completion_mask is None else sum(self.completion_mask)

    @property
    def num_tokens(self) -> int:
        return len(self.completion_ids)

    def row(self) -> dict:
        """A flat dict for tables (token lists left out; their lengths kept)."""
        out = asdict(self)
        for key in ("prompt_ids", "completion_ids", "logprobs", "ref_logprobs", "rewards", "extras"):
            out.pop(key)
        out.pop("completion_mask")
        segment, segments = out.pop("segment"), out.pop("segments")
        if segments > 1:
            out["segment"] = f"{segment + 1}/{segments}"
        turns = out.pop("turns")
        out["num_tokens"] = self.num_tokens
        if turns is not None:
            out["turns"] = len(turns)
            out["tool_calls"] = sum(t["tool_calls"] for t in turns)
            out["tool_errors"] = sum(t["tool_errors"] for t in turns)
            out["trained_tokens"] = self.trained_tokens
        out.update({f"reward/{k}": v for k, v in self.rewards.items()})
        return out
