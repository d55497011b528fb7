"""What a reward is called on, and what scoring a batch returns.

A reward is ``reward(prompt, completion, target, **context) -> float``; `context` carries the
training state of the sample (step, policy version, sample id, prompt id) and the dataset's other
columns. `prompt` is the prompt as the model saw it (chat template applied). A batched reward
(`rewards.forms`) gets the same as columns: ``reward(prompts, completions, targets, **columns)``.
Batches travel to the reward actors as columns (`RewardBatch`), far cheaper to send than one object
per sample.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from forge_nb.rewards.verdicts import JudgeStats


@dataclass(frozen=True)
class RewardSample:
    """One sample a reward is called on: ``reward(prompt, completion, target, **context)``."""

    prompt: str
    completion: str
    target: str
    context: dict


@dataclass(frozen=True)
class RewardBatch:
    """A batch to score, as columns (one entry per sample); `samples()` expands it where it is scored."""

    prompts: list[str]
    completions: list[str]
    targets: list[str]
    policy_versions: list[int]
    sample_ids: list[int]
    prompt_ids: list[str]
    extras: list[dict]
    step: int

    def __len__(self) -> int:
        return len(self.prompts)

    def shard(self, part: slice) -> RewardBatch:
        columns = (
            self.prompts,
            self.completions,
            self.targets,
            self.policy_versions,
            self.sample_ids,
            self.prompt_ids,
            self.extras,
        )
        return RewardBatch(*(c[part] for c in columns), step=self.step)

    def samples(self) -> Iterator[RewardSample]:
        for i in range(len(self)):
            context = {
                **self.extras[i],
                "step": self.step,
                "policy_version": self.policy_versions[i],
                "sample_id": self.sample_ids[i],
                "prompt_id": self.prompt_ids[i],
            }
            yield RewardSample(self.prompts[i], self.completions[i], self.targets[i], context)

    def columns(self) -> dict[str, list]:
        """The keywords of a batched reward: prompts, completions, targets and one list per context
        column (a dataset column missing from some rows is None there)."""
        n = len(self)
        keys = dict.fromkeys(k for row in self.extras for k in row)
        extras = {key: [row.get(key) for row in self.extras] for key in keys}
        return {
            **extras,
            "prompts": self.prompts,
            "completions": self.completions,
            "targets": self.targets,
            "step": [self.step] * n,
            "policy_version": self.policy_versions,
            "sample_id": self.sample_ids,
            "prompt_id": self.prompt_ids,
        }


def columns_of(samples: Sequence[RewardSample]) -> dict[str, list]:
    """`RewardBatch.columns` for samples already expanded (the probe batches live code is checked on)."""
    keys = dict.fromkeys(k for s in samples for k in s.context)
    return {
        **{key: [s.context.get(key) for s in samples] for key in keys},
        "prompts": [s.prompt for s in samples],
        "completions": [s.completion for s in samples],
        "targets": [s.target for s in samples],
    }


@dataclass
class Scores:
    """Rewards of one batch under one reward version.

    `rewards[i]` is sample i's weighted sum over the live members (None where it failed: `errors[i]`
    says which member and why); `components[name][i]` is each member's own score. `judge` is the
    judge traffic the batch caused, `judge_problems` the judges that could not answer (model -> "not
    running", "timed out" or "failed"), for the session to start or replace them.
    """

    rewards: list[float | None]
    errors: dict[int, str] = field(default_factory=dict)
    reward_version: int = 0
    components: dict[str, list[float | None]] = field(default_factory=dict)
    timed_out: bool = False  # a reward ran past its deadline: it may still be running where it was called
    judge: JudgeStats = field(default_factory=JudgeStats)
    judge_problems: dict[str, str] = field(default_factory=dict)

    @classmethod
    def combine(
        cls, components: dict[str, list[float | None]], weights: dict[str, float], errors: dict[int, str], version: int
    ) -> Scores:
        """Weighted sums of the members' scores; a sample that any member failed on has none."""
        size = len(next(iter(components.values()))) if components else 0
        rewards = [
            None if i in errors else sum(weights[n] * components[n][i] for n in components if weights[n] != 0)
            for i in range(size)
        ]
        return cls(rewards, errors, version, components)
