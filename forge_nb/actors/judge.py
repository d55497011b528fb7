"""Judge actor: one judge model (SmolLM2-135M-Instruct by default, any HF causal LM), serving the
verdicts the reward procs ask for (`rewards.judge_client.ask`), a whole batch per request."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from monarch.actor import endpoint

from forge_nb.actors.base import ForgeActor
from forge_nb.parallel.device import resolve_device
from forge_nb.rewards.judge_model import JudgeModel
from forge_nb.rewards.verdicts import JudgeAnswer, JudgeRequest, JudgeStats


@dataclass(frozen=True)
class JudgeSpec:
    """`model`: a registered name or an HF directory; run in `dtype` on `device` with `threads` torch threads."""

    model: str
    dtype: str = "float32"
    device: str = "cpu"
    threads: int = 2


class JudgeActor(ForgeActor):
    """Loads the judge model once; answers requests one at a time (concurrent callers queue)."""

    role = "judge"

    def __init__(self, spec: JudgeSpec) -> None:
        from forge_nb.models.registry import resolve_model

        self._begin(spec.threads)
        model_dir = resolve_model(spec.model)
        self.judge = JudgeModel.load(model_dir, getattr(torch, spec.dtype), str(resolve_device(spec.device)))
        self.served = JudgeStats()
        self._ready(model=spec.model, model_dir=str(model_dir))

    @endpoint
    def verdicts(self, request: JudgeRequest) -> JudgeAnswer:
        """The verdict of every message in `request` (probabilities or texts), with compute seconds."""
        answer = self.judge.answer(request)
        self.served += JudgeStats(1, len(request), 0.0, answer.seconds, answer.tokens)
        return answer

    @endpoint
    def stats(self) -> JudgeStats:
        """Everything this judge has served (for benchmarks and debugging)."""
        return self.served
