"""Reference actor: the policy's initial weights, frozen, scoring completions for the KL penalty."""

from __future__ import annotations

from dataclasses import dataclass, field

from monarch.actor import endpoint

from forge_nb.actors.base import ForgeActor
from forge_nb.actors.model_spec import ModelSpec
from forge_nb.config import Config, TrainerConfig
from forge_nb.parallel.device import resolve_device
from forge_nb.parallel.gang import Gang, collectives
from forge_nb.parallel.policy import Policy, PolicySpec


@dataclass(frozen=True)
class ReferenceSpec(ModelSpec):
    """The frozen model as `ModelSpec.from_config` reads it from the config, in as many procs as the
    trainer (`procs`), sharded like it (FSDP2 when `trainer` says so for that many procs)."""

    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    procs: int = 1

    @classmethod
    def from_config(cls, config: Config, pad_id: int) -> ReferenceSpec:
        return super().from_config(config, pad_id, trainer=config.trainer, procs=config.mesh.trainer_procs)


class Reference(ForgeActor):
    """Loads the model once and never changes it (started when ``algorithm.kl_coef > 0``)."""

    role = "reference"

    def __init__(self, spec: ReferenceSpec) -> None:
        self._begin(spec.threads)
        sharded = spec.trainer.sharded(spec.procs)
        gang = Gang.join(resolve_device(spec.device), spec.trainer.collective_timeout_s) if sharded else Gang()
        policy = PolicySpec(
            spec.model_dir, spec.dtype, spec.device, spec.pad_id, spec.temperature, spec.trainer, sharded
        )
        self.policy, self.rank = Policy(policy, gang), gang.rank
        self.policy.model.eval()
        self._ready(rank=gang.rank, procs=gang.world)

    @endpoint
    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Reference logprobs of each completion's tokens (``logits / temperature``, as the trainer's;
        every proc of a sharded reference is called and runs its part)."""
        with collectives(self.rank, "reference"):  # a rank gone: GangError, and the session starts the gang afresh
            return self.policy.logprobs(prompt_ids, completion_ids)
