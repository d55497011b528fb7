"""What a reward proc asks a judge actor, what the judge answers, and the running count of both.

A request carries the judge's user messages, already filled from its template, and how to read a
verdict: ``"choice"`` (one forward pass: the probability of the first choice, e.g. "Yes", against the
others at the first answer token) or ``"generate"`` (greedy text, parsed by the reward proc).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class JudgeRequest:
    """`messages[i]`: the user message for sample i (the judge applies its chat template)."""

    messages: list[str]
    mode: str = "choice"  # "choice" or "generate"
    choices: tuple[str, ...] = ("Yes", "No")
    system_prompt: str = ""
    max_tokens: int = 8  # "generate": new tokens per verdict
    batch_size: int = 16  # sequences per forward pass

    def __len__(self) -> int:
        return len(self.messages)


@dataclass(frozen=True)
class JudgeAnswer:
    """`probabilities[i]` ("choice": P(first choice), renormalised over the choices) or `texts[i]`
    ("generate"); `seconds` the judge's compute time, `tokens` the tokens it ran (prompts + new)."""

    probabilities: list[float] | None
    texts: list[str] | None
    seconds: float
    tokens: int


@dataclass(frozen=True)
class JudgeStats:
    """Judge traffic of one proc (or a sum of procs): requests, verdicts, seconds blocked waiting on
    the judge (`wait_s`, queueing included), the judge's own compute seconds and tokens."""

    calls: int = 0
    verdicts: int = 0
    wait_s: float = 0.0
    judge_s: float = 0.0
    tokens: int = 0

    def __add__(self, other: JudgeStats) -> JudgeStats:
        return JudgeStats(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __sub__(self, other: JudgeStats) -> JudgeStats:
        return JudgeStats(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def row(self) -> dict[str, float]:
        """Metrics for the stream: the counts, mean latency per call (s) and verdicts per judge second."""
        return {
            "calls": self.calls,
            "verdicts": self.verdicts,
            "wait_s": self.wait_s,
            "judge_s": self.judge_s,
            "tokens": self.tokens,
            "latency_s": self.wait_s / self.calls if self.calls else 0.0,
            "verdicts_per_s": self.verdicts / self.judge_s if self.judge_s > 0 else 0.0,
            "tokens_per_s": self.tokens / self.judge_s if self.judge_s > 0 else 0.0,
        }
