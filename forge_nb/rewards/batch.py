"""What a reward is called on, and what scoring a batch returns.

A reward is ``reward(prompt, completion, target, **context) -> float``; `context` carries the
training state of the sample (step, policy version, sample id, prompt id) and the dataset's other
columns. `prompt` is the prompt as the model saw it (chat template applied). A batched reward
(`rewards.forms`) gets the batch as columns, as TRL's GRPOTrainer passes them (`rewards.trl_form`):
``reward(prompts, completions, completion_ids, targets, **columns)``. Batches travel to the reward
actors as columns (`RewardBatch`), far cheaper to send than one object per sample.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from forge_nb.rewards.trl_form import PROMPT_AS_GIVEN, batched_keywords, prompt_as_given
from forge_nb.rewards.verdicts import JudgeStats


@dataclass(frozen=True)
class RewardSample:
    """One sample a reward is called on: ``reward(prompt, completion, target, **context)``.
    A batched reward also gets `completion_ids` and `prompt_given` (the prompt as the dataset gave it:
    chat messages or text; None: `prompt`)."""

    prompt: str
    completion: str
    target: str
    context: dict
    completion_ids: list[int] = field(default_factory=list)
    prompt_given: str | list | None = None


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
    completion_ids: list[list[int]] | None = None  # per sample; None: not known (scored as empty)

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
        ids = None if self.completion_ids is None else self.completion_ids[part]
        return RewardBatch(*(c[part] for c in columns), step=self.step, completion_ids=ids)

    def _ids(self, i: int) -> list[int]:
        return [] if self.completion_ids is None else self.completion_ids[i]

    def samples(self) -> Iterator[RewardSample]:
        for i in range(len(self)):
            context = {
                **{k: v for k, v in self.extras[i].items() if k != PROMPT_AS_GIVEN},
                "step": self.step,
                "policy_version": self.policy_versions[i],
                "sample_id": self.sample_ids[i],
                "prompt_id": self.prompt_ids[i],
            }
            given = self.extras[i].get(PROMPT_AS_GIVEN)
            yield RewardSample(self.prompts[i], self.completions[i], self.targets[i], context, self._ids(i), given)

    def columns(self) -> dict[str, list]:
        """The keywords of a batched reward (`trl_form.batched_keywords`): TRL's, then targets and
        one list per context column (a dataset column missing from some rows is None there)."""
        n = len(self)
        contexts = [
            {**self.extras[i], "step": self.step, "policy_version": self.policy_versions[i],
             "sample_id": self.sample_ids[i], "prompt_id": self.prompt_ids[i]}
            for i in range(n)
        ]  # fmt: skip
        prompts = [prompt_as_given(p, e) for p, e in zip(self.prompts, self.extras)]
        ids = [self._ids(i) for i in range(n)]
        return batched_keywords(prompts, self.completions, ids, self.targets, contexts, self.step)


def columns_of(samples: Sequence[RewardSample]) -> dict[str, list]:
    """`RewardBatch.columns` for samples already expanded (the probe batches live code is checked on)."""
    prompts = [s.prompt if s.prompt_given is None else s.prompt_given for s in samples]
    step = next((s.context["step"] for s in samples if "step" in s.context), 0)
    return batched_keywords(
        prompts,
        [s.completion for s in samples],
        [list(s.completion_ids) for s in samples],
        [s.target for s in samples],
        [s.context for s in samples],
        step,
    )


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
    weights: dict[str, float] = field(default_factory=dict)  # each member's weight in `rewards` (for GDPO)

    @classmethod
    def combine(
        cls, components: dict[str, list[float | None]], weights: dict[str, float], errors: dict[int, str], version: int
    ) -> Scores:
        """Weighted sums of the members' scores; a sample that any member failed on has none. A member
        that gave a sample no score (None, TRL's "does not apply here") adds nothing to its sum."""
        size = len(next(iter(components.values()))) if components else 0
        rewards = [
            None
            if i in errors
            else sum(
                weights[n] * components[n][i] for n in components if weights[n] != 0 and components[n][i] is not None
            )
            for i in range(size)
        ]
        return cls(rewards, errors, version, components, weights=dict(weights))
