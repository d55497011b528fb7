"""Trainer actor: owns the trainable policy, takes GRPO steps with the live loss, publishes weights."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from monarch.actor import endpoint

from forge_nb.actors.base import ForgeActor
from forge_nb.actors.model_spec import ModelSpec
from forge_nb.config import AlgorithmConfig, Config, LoraConfig, TrainerConfig
from forge_nb.live.capture import LiveCode, compile_function
from forge_nb.live.validate import CheckFailed, check_loss_value
from forge_nb.parallel.device import resolve_device
from forge_nb.parallel.gang import Gang, GangError, collectives
from forge_nb.parallel.policy import AdamStep, Policy, PolicySpec
from forge_nb.rl import epochs
from forge_nb.rl.batch import TrainBatch
from forge_nb.rl.target_batch import Datums
from forge_nb.rl.update import NonFiniteGradient
from forge_nb.weights.group import GroupSender, GroupSpec, group_spec
from forge_nb.weights.manifest import WeightManifest, checksum
from forge_nb.weights.publish import WeightPublisher
from forge_nb.weights.stream import host_addresses

STATE_FILE = "trainer_state.pt"


class LossFailed(RuntimeError):
    """The live loss failed on a training batch (on its first step: no optimizer step was taken)."""


class LossFailedAfterSteps(LossFailed):
    """The live loss failed on a step after the batch's first: the steps before it were taken and published.
    `metrics`: the batch's train metrics (`step.train`), for whoever finishes its step boundary first."""

    def __init__(self, message: str, metrics: dict) -> None:
        super().__init__(message)
        self.metrics = metrics


class LossRaised(RuntimeError):
    """The live loss raised on a step (its message: what it raised)."""


@dataclass(frozen=True)
class TrainerSpec(ModelSpec):
    """The trainable model (`ModelSpec`), its optimisation (`algorithm`, the loss it starts with), and
    how it publishes weights (`serve_dtype`, RDMA chunks of `chunk_mb`). With `lora`, only a LoRA
    adapter on the frozen base trains, and only the adapter is published."""

    algorithm: AlgorithmConfig
    loss: LiveCode
    serve_dtype: str
    chunk_mb: int
    transport: str = "auto"  # weights.transport: on a GPU, "auto" and "cuda_ipc" keep snapshots in its memory too
    resume_from: str = ""  # a checkpoint's trainer/ folder (`save_state`): weights, optimizer, RNG, versions
    loss_version: int = 0
    lora: LoraConfig | None = None
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    procs: int = 1  # the gang's size (mesh.trainer_procs): every proc gets this same spec
    version: int = 0  # the policy version fresh weights are published as (a Tinker create_model's: the next one)
    # Where each rank serves its weights streams (its host's address on the mesh's network, by rank) and the
    # session's secret its readers prove (`weights.stream`); set by the fleet, never in a config or a checkpoint.
    stream_hosts: tuple[str, ...] = ()
    stream_secret: bytes = field(default=b"", repr=False)

    @classmethod
    def from_config(cls, config: Config, pad_id: int, loss: LiveCode) -> TrainerSpec:
        return super().from_config(
            config,
            pad_id,
            algorithm=config.algorithm,
            loss=loss,
            serve_dtype=config.serve_dtype,
            chunk_mb=config.weights.chunk_mb,
            transport=config.weights.transport,
            lora=config.lora if config.lora.enabled else None,
            trainer=config.trainer,
            procs=config.mesh.trainer_procs,
        )

    def policy(self) -> PolicySpec:
        """What each rank's `Policy` holds. With LoRA a checkpoint holds the adapter only: the base
        always comes from the model's directory."""
        return PolicySpec(
            self.model_dir if self.lora else (self.resume_from or self.model_dir),
            self.dtype,
            self.device,
            self.pad_id,
            self.temperature,
            self.trainer,
            self.trainer.sharded(self.procs),
            self.algorithm.lr,
            self.lora,
            self.resume_from if self.lora else "",
        )


@dataclass(frozen=True)
class TrainResult:
    """What one `train_step` did: the policy version it published, the loss version it ran, the
    step's metrics (`rl.update.policy_update`: loss, grad_norm, approx_kl, tokens, ...) and times (s)."""

    policy_version: int
    loss_version: int
    metrics: dict[str, float]
    train_seconds: float
    publish_seconds: float
    # Per sequence, the policy's logprob of each completion token before its step (the rollout log's
    # "trainer_logprobs", beside the generator's; with mini-batches, mini-batch k's after the k - 1 steps before
    # it); rows the step left out keep their behaviour logprobs.
    # None when the batch did not ask for them (`TrainBatch.keep_logprobs`: no rollout log).
    token_logprobs: list[list[float]] | None = None
    # The live loss failed on a step after the batch's first: where, and what it raised (the steps before it
    # were taken and published). The step boundary raises it (`step.raise_loss_error`), once the step finished.
    error: str | None = None

    def as_dict(self) -> dict[str, float]:
        skip = ("metrics", "token_logprobs", "error")
        return {**self.metrics, **{k: v for k, v in self.__dict__.items() if k not in skip}}


class Trainer(ForgeActor):
    """Holds one rank's `Policy` (the model, or its FSDP2 shards in a gang of `mesh.trainer_procs`
    procs, and the AdamW state of the trainable parameters: every weight, or the LoRA adapter's) and
    the live loss. Its policy version (batches trained, each one version; 0 = as loaded) is the one it published
    last: `version`. Every rank publishes, loads and saves its own shards; rank 0 answers; every
    rank runs every call (each is a collective). With LoRA it is also the reference model: the base,
    adapter off."""

    role = "trainer"

    def __init__(self, spec: TrainerSpec) -> None:
        self._begin(spec.threads)
        torch.manual_seed(0)
        sharded = spec.trainer.sharded(spec.procs)
        self.gang = Gang.join(resolve_device(spec.device), spec.trainer.collective_timeout_s) if sharded else Gang()
        self.policy = Policy(spec.policy(), self.gang)
        self.algorithm = spec.algorithm
        self._use_loss(spec.loss, spec.loss_version)
        self.version = self._load_state(spec.resume_from) if spec.resume_from else spec.version
        # Every rank publishes its own shards (no gather): a generator reads from all ranks at once.
        shards, rows = self.policy.local_published()
        serve_dtype = getattr(torch, spec.serve_dtype)
        rank, ranks = self.gang.rank, self.gang.world
        on_gpu = self.policy.device.type == "cuda" and spec.transport in ("auto", "cuda_ipc", "group")
        self.publisher = WeightPublisher(
            shards,
            self.version,
            serve_dtype,
            spec.chunk_mb,
            rows=rows,
            rank=rank,
            ranks=ranks,
            device=self.policy.device if on_gpu else None,
            host=spec.transport != "cuda_ipc",
            stream_secret=spec.stream_secret,
            stream_host=spec.stream_hosts[rank] if rank < len(spec.stream_hosts) else "127.0.0.1",
        )
        self._group_spec: GroupSpec | None = None  # weights.transport "group": this rank's broadcast group
        self._group: GroupSender | None = None
        self._ready(
            device=str(self.policy.device),
            lora=self.policy.lora,
            loaded=self.policy.loaded,
            policy_version=self.version,  # a restored trainer's says where it starts
            **self.sizes(),
        )

    def sizes(self) -> dict[str, int]:
        """Trainable and total parameters, the adapter's bytes (0 without LoRA), the bytes of this rank's
        published snapshot (its share of what one refresh moves, its 64-byte header and alignment
        included), the gang (rank, procs) and what this rank holds of parameters, gradients and optimizer
        state."""
        refresh = self.publisher.nbytes
        return {**self.policy.sizes(), "refresh_bytes": refresh, "rank": self.gang.rank, "procs": self.gang.world}

    @endpoint
    def set_loss(self, code: LiveCode, version: int) -> int:
        """Compile and make loss `version` live for the next batch -> the version now live."""
        self._use_loss(code, version)
        return self.loss_version

    def _use_loss(self, code: LiveCode, version: int) -> None:
        self.loss_fn, self.loss_version, self.loss_inert = compile_function(code), version, code.zero_advantage_inert

    @endpoint
    def train_batch(self, batch: TrainBatch) -> TrainResult:
        """The batch's optimizer steps (`algorithm.epochs` passes over B sequences, `algorithm.mini_batches`
        steps each: `rl.epochs`; one by default; every rank gets the whole batch and runs its part), then
        publish the new weights. The policy version goes up by one a batch; the published snapshot holds it
        when this returns. If the live loss fails on the first step, `LossFailed` is raised and neither
        weights nor versions change; on a later one, the steps before it are published and the result says
        where the loss failed (`TrainResult.error`). If a collective fails (a rank died or hangs), `GangError`."""
        start = time.perf_counter()
        a = self.algorithm
        try:
            steps = epochs.run(
                batch, a.epochs, a.mini_batches, self._step, (CheckFailed, NonFiniteGradient, LossRaised)
            )
        except (CheckFailed, NonFiniteGradient) as e:
            raise LossFailed(f"loss v{self.loss_version} {e}; no optimizer step was taken") from None
        except LossRaised as e:
            raise LossFailed(f"loss v{self.loss_version} {e}; no step was taken") from None
        metrics, stepped = steps.combined(), time.perf_counter()
        self._publish(self.version + 1)
        end = time.perf_counter()
        logprobs = steps.logprobs if self.gang.leader else None  # rank 0 answers for the gang: one copy travels
        error = None
        if steps.error is not None:
            taken = len(steps.metrics)
            error = (
                f"loss v{self.loss_version} failed on step {taken + 1} of the batch's {a.epochs * len(steps.rows)} "
                f"({steps.error}); the {taken} steps before it were taken and published as policy v{self.version}"
            )
        return TrainResult(self.version, self.loss_version, metrics, end - start, end - stepped, logprobs, error)

    def _step(self, part: TrainBatch) -> tuple[dict[str, float], list[list[float]] | None]:
        """One optimizer step on `part` (`Policy.update`); what the loss itself raised as `LossRaised`."""
        a = self.algorithm
        try:
            with collectives(self.gang.rank):
                return self.policy.update(
                    part, self.loss_fn, a.max_grad_norm, check_loss_value, self.loss_inert, a.metric_clip, a.ratio_level
                )
        except (CheckFailed, NonFiniteGradient, GangError):
            raise
        except Exception as e:  # the loss's own error (a collective's is GangError)
            raise LossRaised(f"raised {type(e).__name__}: {e}") from None

    def _publish(self, version: int) -> None:
        """This rank's shards of the new weights into its snapshot (no collective)."""
        self.publisher.publish(self.policy.local_published()[0], version)
        self.version = version

    @endpoint
    def drop_gpu_snapshots(self) -> bool:
        """No generator reads this rank's GPU snapshots: free them (`WeightPublisher.drop_gpu`)."""
        dropped = self.publisher.drop_gpu()
        if dropped and self.policy.device.type == "cuda":
            torch.cuda.empty_cache()
        return dropped

    @endpoint
    def host_snapshots(self, on: bool) -> bool:
        """Copy each published version into host memory too (`on`: a generator reads it there), or keep it
        on the GPU only (every generator opened the GPU snapshots) -> whether host copies are made now."""
        self.publisher.keep_host(on, self.policy.local_published()[0])
        return self.publisher.host_live

    @endpoint
    def weights_manifest(self) -> WeightManifest:
        """Layout and handles of this rank's published snapshot (stable for the session)."""
        return self.publisher.manifest()

    @endpoint
    def weights_group(self, replicas: int, timeout_s: float, backend: str) -> GroupSpec:
        """A broadcast group for this rank's snapshots and `replicas` generators (`weights.group`): "nccl" from
        its GPU snapshots, "gloo" from host memory. Joined by `join_weights_group`."""
        if backend == "nccl" and self.publisher.gpu is None:
            raise ValueError("an NCCL weights group needs the trainer's snapshots on its GPU")
        self._group_spec = group_spec(host_addresses(), replicas + 1, backend, timeout_s)
        return self._group_spec

    @endpoint
    def join_weights_group(self) -> None:
        """Open the group as its member 0 and serve its refreshes from a thread (the generators join at once:
        this waits for them). A group from before (the generators were replaced) is left."""
        if self._group is not None:
            self._group.stop()
            self._group = None
        on_gpu = self._group_spec.backend == "nccl"
        self._group = GroupSender(self._group_spec, lambda v: self.publisher.snapshot(v, on_gpu), self.publisher.lock)

    @endpoint
    def unlink_shared_memory(self) -> None:
        """Drop the /dev/shm names once every generator has mapped them (nothing can leak after)."""
        self.publisher.unlink()

    @endpoint
    def save(self, path: str, merged: bool = True) -> int:
        """Write the current weights as an HF model directory (config.json + safetensors) -> version.
        With LoRA: the adapter in peft's format at `path`, and (`merged`) the merged model at path/merged."""
        with collectives(self.gang.rank):
            self.policy.save_pretrained(path, merged=merged)
        return self.version

    @endpoint
    def save_state(self, path: str) -> int:
        """Write what resuming needs exactly, at any number of procs: the weights (HF directory; with LoRA
        the adapter, in peft's format), each rank's shards of the trainable weights and optimizer state
        (`parallel.training_state`), and `trainer_state.pt` with the RNG state and the policy version -> version."""
        with collectives(self.gang.rank):  # a rank gone mid-save: GangError, the gang is restarted
            self.policy.save_pretrained(path)
            self.policy.save_state(path)
        if self.gang.leader:
            torch.save({"rng": torch.get_rng_state(), "version": self.version}, Path(path) / STATE_FILE)
        return self.version

    # -- Tinker's training calls (`server.tinker`): gradients accumulate until optim_step publishes -------------

    @endpoint
    def forward_backward(
        self, datums: Datums, loss: str, config: dict, forward_only: bool
    ) -> tuple[list[list[float]], list[float]]:
        """Tinker's forward_backward (`Policy.forward_backward`) -> (each datum's logprobs, each one's loss)."""
        with collectives(self.gang.rank):
            return self.policy.forward_backward(datums, loss, config, forward_only)

    @endpoint
    def optim_step(self, step: AdamStep) -> dict[str, float]:
        """Tinker's optim_step (`Policy.optim_step`), then publish the weights as the next policy version ->
        grad_norm, policy_version and the seconds of the step and of the publish."""
        start = time.perf_counter()
        with collectives(self.gang.rank):
            metrics = self.policy.optim_step(step)
        stepped = time.perf_counter()
        self._publish(self.version + 1)
        end = time.perf_counter()
        times = {"step_seconds": stepped - start, "publish_seconds": end - stepped}
        return {**metrics, "policy_version": self.version, **times}

    @endpoint
    def load_state(self, path: str, optimizer: bool) -> int:
        """The weights (and with `optimizer` the optimizer state) a `save_state` wrote at `path`, published as
        the next policy version -> that version."""
        with collectives(self.gang.rank):
            self.policy.load_state(path, optimizer)
        self._publish(self.version + 1)
        return self.version

    def _load_state(self, path: str) -> int:
        saved = torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)
        if "optimizer" in saved:  # written by one proc before the state was sharded (forge_nb <= wave 3)
            if self.gang.world > 1:
                raise ValueError(
                    f"{path} was saved by one trainer proc of an earlier forge_nb; resume it with "
                    "mesh.trainer_procs=1, save a checkpoint, then resume that one at any number of procs"
                )
            self.policy.optimizer.load_state_dict(saved["optimizer"])
        else:
            self.policy.load_state(path)
        torch.set_rng_state(saved["rng"])
        return saved["version"]

    # -- diagnostics: for tests and debugging, never on the training path ----------------------

    @endpoint
    def checksum(self) -> tuple[int, str]:
        """(policy version, checksum of what the trainer publishes: its parameters, or the adapter's)."""
        with collectives(self.gang.rank):
            whole = [(name, t.cpu()) for name, t in self.policy.whole_published()]
        return self.version, checksum(whole)

    @endpoint
    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Recompute the completions' token logprobs under the current weights (no grad)."""
        return self.policy.logprobs(prompt_ids, completion_ids)

    @endpoint
    def reference_logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """LoRA only: the reference model's logprobs, i.e. the base's with the adapter off (no second
        copy of the weights; the `Reference` actor's contract)."""
        with collectives(self.gang.rank), self.policy.model.disable_adapter():  # a rank gone: GangError
            return self.policy.logprobs(prompt_ids, completion_ids)
