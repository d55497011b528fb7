"""One rank's copy of the policy: the model (whole, or its FSDP2 shards in a gang), the AdamW state of
its trainable parameters, and what runs through it (an update, logprobs, whole weights).

Plain PyTorch: the trainer and reference actors hold a `Policy`, and so does a script or the GPU check.
In a gang every rank holds the whole batch and runs the same calls in the same order (each one is a
collective); rank 0 (`Gang.leader`) answers. Every rank reads and writes its own rows of the model's files
(`sharded_load`, `sharded_save`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from forge_nb.config import LoraConfig, TrainerConfig
from forge_nb.lora import adapter
from forge_nb.parallel import fsdp, sharded_load, sharded_save
from forge_nb.parallel import training_state as state
from forge_nb.parallel.device import resolve_device
from forge_nb.parallel.gang import Gang
from forge_nb.rl import tinker_losses
from forge_nb.rl.batch import TrainBatch
from forge_nb.rl.prefix_batch import collate_prefix
from forge_nb.rl.split import Split, completion_values
from forge_nb.rl.target_batch import Datums
from forge_nb.rl.update import (
    LossFn,
    NonFiniteGradient,
    UpdateOptions,
    accumulate,
    clip_gradients,
    forward_logprobs,
    policy_update,
)


@dataclass(frozen=True)
class PolicySpec:
    """The model at `source` (an HF directory) in `dtype` on `device`; `lora`: an adapter on it (the one
    in `adapter_dir`, else fresh); `lr` None: frozen (a reference). `trainer`: micro-batches, activation
    checkpointing, mixed precision, offload; `sharded`: FSDP2 over the gang (`TrainerConfig.sharded`)."""

    source: str
    dtype: str
    device: str
    pad_id: int
    temperature: float
    trainer: TrainerConfig
    sharded: bool
    lr: float | None = None
    lora: LoraConfig | None = None
    adapter_dir: str = ""


class Policy:
    """The model and optimizer of one rank (see the module docstring)."""

    def __init__(self, spec: PolicySpec, gang: Gang) -> None:
        self.spec, self.gang = spec, gang
        self.device = resolve_device(spec.device)
        dtype = getattr(torch, spec.dtype)
        model = None
        #: How this rank got its weights: "by rows" (its own rows of the files: `parallel.sharded_load`; it
        #: writes them back the same way), "whole" (one proc), or "whole: <why>" (a sharded policy whose
        #: directory cannot be read by rows: every rank loads the model, then keeps its shards).
        self.loaded = "whole"
        if spec.sharded:
            on = torch.device("cpu") if spec.trainer.cpu_offload else self.device
            try:
                model = sharded_load.build(spec.source, dtype, self._prepare, self._shard, self.device, on)
                self.loaded = "by rows"
            except sharded_load.NotByRows as e:
                self.loaded = f"whole: {e}"
        if model is None:
            model = self._prepare(AutoModelForCausalLM.from_pretrained(spec.source, dtype=dtype))
            if spec.sharded:
                self._shard(model)
            else:
                _own_memory(model.to(self.device))
        self.model = model
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=spec.lr, weight_decay=0.0) if spec.lr is not None else None
        #: Tinker's gradients, summed over its forward_backward calls until its optim_step (one per trainable
        #: parameter, in order; None: none yet). Kept apart from `.grad`, which the session's own steps zero.
        self.accumulated: list[torch.Tensor | None] | None = None

    def _prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """The loaded (or still empty) model made what this policy trains: an adapter, frozen weights,
        checkpointing."""
        spec = self.spec
        if spec.lora is not None:
            model = adapter.wrap(model, spec.lora, spec.adapter_dir)
        if spec.lr is None:
            model.requires_grad_(False)
        if spec.trainer.activation_checkpointing and spec.lr is not None:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        return fsdp.shard(model, self.gang, self.spec.trainer.mixed_precision, self.spec.trainer.cpu_offload)

    @property
    def by_rows(self) -> bool:
        return self.loaded == "by rows"

    @property
    def lora(self) -> bool:
        return self.spec.lora is not None

    def split(self) -> Split:
        """How this rank takes its part of a batch (`rl.split`)."""
        return Split(self.gang.rank, self.gang.world, self.spec.trainer.micro_batch_tokens, self.gang.sum_across)

    def update(
        self,
        batch: TrainBatch,
        loss_fn: LossFn,
        max_grad_norm: float,
        check_loss: Callable[[torch.Tensor], torch.Tensor],
        skip_zero_advantage: bool,
        clip: tuple[float, float] = (0.2, 0.2),
        ratio_level: str = "token",
    ) -> tuple[dict[str, float], list[list[float]] | None]:
        """One optimizer step on the whole `batch` (this rank runs its part) -> (metrics, each completion's
        token logprobs before the step when `batch.keep_logprobs`). `clip`, `ratio_level`: the ratio range
        and level the `clip_fraction` metric counts against (`rl.update.policy_update`)."""
        tokens = batch.collate(self.spec.pad_id, self.spec.trainer.activation_checkpointing).to(self.device)
        try:
            options = UpdateOptions(
                temperature=self.spec.temperature,
                max_grad_norm=max_grad_norm,
                check_loss=check_loss,
                skip_zero_advantage=skip_zero_advantage,
                split=self.split(),
                clip=clip,
                with_entropy=self.spec.trainer.entropy,
                ratio_level=ratio_level,
            )
            metrics, logprobs = policy_update(self.model, self.optimizer, tokens, loss_fn, options)
        except BaseException:
            self._abandon_step()
            raise
        if not batch.keep_logprobs:
            return metrics, None
        return metrics, completion_values(logprobs.cpu(), tokens.completion_mask.cpu())

    def _abandon_step(self) -> None:
        """After a step that raised (a live loss refused, a non-finite gradient): no gradient kept, and a
        sharded model's iteration state reset (FSDP2 otherwise expects the backward of the forward it
        ran, and the next step fails resizing its parameters' storage)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.spec.sharded:
            fsdp.reset_iteration(self.model)

    # -- Tinker's training calls: forward_backward adds gradients, optim_step takes the step -----------------
    def forward_backward(
        self, datums: Datums, loss: str, config: dict[str, float], forward_only: bool = False
    ) -> tuple[list[list[float]], list[float]]:
        """Tinker's `forward_backward` (or `forward`, `forward_only`) on `datums` with its built-in loss `loss`
        (`rl.tinker_losses`; `config` checked) -> (each datum's logprobs of its targets, each datum's loss).
        Logprobs are at temperature 1, as Tinker's are. The loss's gradient is added to what this policy
        accumulated since the last `optim_step` (each rank runs its part, as an update does); a pass that fails
        drops what was accumulated (the error says so), so no half-added gradient ever steps."""
        batch = datums.collate(self.spec.pad_id).to(self.device)
        split = self.split()
        if forward_only:
            logprobs = forward_logprobs(self.model, batch, split, 1.0)
        else:

            def loss_fn(lp: torch.Tensor, *_: torch.Tensor) -> torch.Tensor:
                return tinker_losses.total(tinker_losses.per_token(loss, lp, batch.inputs, config), batch.loss_mask)

            with self._accumulating():
                _, logprobs = accumulate(self.model, batch, loss_fn, UpdateOptions(temperature=1.0, split=split))
        with torch.no_grad():
            terms = tinker_losses.per_token(loss, logprobs, batch.inputs, config)
            losses = tinker_losses.per_datum(terms, batch.loss_mask)
        return batch.rows(logprobs.cpu()), losses.cpu().tolist()

    @contextmanager
    def _accumulating(self) -> Iterator[None]:
        """Backward into `accumulated`: it is each parameter's `.grad` for the pass, then put aside again."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        kept = self.accumulated or [None] * len(trainable)
        for p, g in zip(trainable, kept):
            p.grad = g
        try:
            yield
        except BaseException:
            self.accumulated = None
            self._abandon_step()
            raise
        self.accumulated = [p.grad for p in trainable]
        for p in trainable:
            p.grad = None

    def optim_step(self, step: AdamStep) -> dict[str, float]:
        """Tinker's `optim_step`: AdamW with `step`'s hyperparameters on the gradients accumulated since the
        last one (clipped to `step.grad_clip_norm` when > 0) -> grad_norm (before clipping). A non-finite
        gradient raises `NonFiniteGradient` before anything moves (the gradients are dropped)."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        for p, g in zip(trainable, self.accumulated or [None] * len(trainable)):
            p.grad = g
        self.accumulated = None
        for group in self.optimizer.param_groups:
            group.update(
                lr=step.learning_rate, betas=(step.beta1, step.beta2), eps=step.eps, weight_decay=step.weight_decay
            )
        norm = clip_gradients(self.model, step.grad_clip_norm if step.grad_clip_norm > 0 else math.inf, self.split())
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteGradient(f"the accumulated gradient's norm is {norm.item()}; no step was taken")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"grad_norm": norm.item()}

    @torch.no_grad()
    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Each completion's token logprobs after its prompt (``logits / temperature``; no grad): every
        rank its part, summed over the gang."""
        was_training = self.model.training
        self.model.eval()
        batch = collate_prefix(prompt_ids, completion_ids, self.spec.pad_id).to(self.device)
        values = forward_logprobs(self.model, batch, self.split(), self.spec.temperature)
        self.model.train(was_training)
        return completion_values(values.cpu(), batch.completion_mask.cpu())

    def published(self) -> list[tuple[str, torch.Tensor]]:
        """What a refresh ships, under the names a generator loads: every parameter, or with LoRA the
        adapter's (peft's saved names). In a gang these are shards (`whole_published` gathers them)."""
        return adapter.adapter_tensors(self.model) if self.lora else list(self.model.named_parameters())

    def local_published(self) -> tuple[list[tuple[str, torch.Tensor]], dict[str, tuple[int, int]]]:
        """What this rank publishes: its own rows of `published()` (the whole tensors when not sharded),
        and which rows those are (`parallel.fsdp.local_shards`; no collective)."""
        if self.spec.sharded:
            fsdp.reshard(self.model)
        return fsdp.local_shards(self.published())

    def whole_published(self) -> Iterator[tuple[str, torch.Tensor]]:
        """`published()` as whole tensors, one at a time (a collective in a gang: every rank iterates)."""
        return fsdp.whole_tensors(self.published())

    def sizes(self) -> dict[str, int]:
        """Trainable and total parameters (whole model), the adapter's bytes (0 without LoRA), and the
        bytes of parameters, gradients and optimizer state this rank holds (`rank_state_bytes`)."""
        counts = adapter.parameter_counts(self.model)
        if not self.lora:
            counts["adapter_bytes"] = 0
        return {**counts, "rank_state_bytes": state.rank_bytes(self.model, self.optimizer)}

    def save_pretrained(self, path: str | Path, merged: bool = False) -> None:
        """The policy as an HF directory at `path` (with LoRA: peft's adapter, and with `merged` the
        merged model in path/merged). Sharded: each rank writes its own rows, nothing is gathered
        (`parallel.sharded_save`; with LoRA only the small adapter is); a model loaded whole is written by
        the leader from a whole copy."""
        if self.by_rows:  # only a sharded policy is made by rows
            fsdp.reshard(self.model)
            if self.lora:
                adapter.save_sharded(self.model, self.gang, path, merged=merged)
            else:
                sharded_save.write(self.model, self.gang, path)
            return
        model = self.model if not self.spec.sharded else state.whole_copy(self.model, self.gang)
        if model is None:  # not the leader: it gave its shards
            return
        if self.lora:
            adapter.save(model, path, merged=merged)
        else:
            model.save_pretrained(str(path))

    def save_state(self, folder: str | Path) -> None:
        """Trainable weights and optimizer state, each rank its shards (`parallel.training_state`)."""
        state.save(folder, self.model, self.optimizer)

    def load_state(self, folder: str | Path, optimizer: bool = True) -> None:
        """What `save_state` wrote, at any number of ranks; `optimizer` False: the weights only, the optimizer
        starting afresh (Tinker's `load_state` without the optimizer). Gradients accumulated are dropped."""
        state.load(folder, self.model, self.optimizer)
        if not optimizer:
            self.optimizer.state.clear()
        self.accumulated = None


@dataclass(frozen=True)
class AdamStep:
    """One Tinker `optim_step`'s AdamW hyperparameters (the SDK's `AdamParams`, its defaults): decoupled weight
    decay, and the global gradient norm clipped to `grad_clip_norm` (0: no clipping)."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@torch.no_grad()
def _own_memory(model: torch.nn.Module) -> None:
    """Give every parameter and buffer memory of its own. On the CPU `from_pretrained` leaves them in the
    weights file's mapping, where a tensor can start 8 bytes past an alignment boundary; oneDNN's
    matrix-vector kernels then round differently than on the aligned copies FSDP2 (and any GPU) makes,
    and a plain trainer and a sharded one disagreed in the last bit of a one-prompt micro-batch."""
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.device.type == "cpu":
            tensor.data = tensor.data.clone()
