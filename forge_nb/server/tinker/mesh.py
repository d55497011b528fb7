"""What the Tinker API does on a session's mesh, as the session's own calls, and what the notebook sees of it.

- a model: the session's trainer, made afresh on the base model (a LoRA adapter of the rank asked for, or every
  weight for rank 0) unless it already is that fresh model (`make_model`);
- forward_backward and optim_step on the trainer gang (`rl.tinker_losses`), an optim_step publishing the next
  policy version as a train step does; a refresh of the generator replicas for save_weights_for_sampler;
- samples from the generator replicas (many requests in one engine call: `sample`), prompt logprobs from their
  weights; the trainer's state to and from disk.

The notebook sees a Tinker-driven run as its own: each optim_step is a trained step (`step_count`), with a "train"
row and a "step" row (mode "tinker": the samples, the sampling, training and refresh seconds since the step
before; rewards are the client's, NaN here); each refresh a "sync" row (`versions("policy")`); each engine call a
"rollout" row; the samples go to the replay buffer (`s.samples()`) and, at the next optim_step, to the rollout
log as that step's (not marked trained: which of them a client trained on is the client's business).

Locks are the session's: training calls hold its training lock, sampling and refreshes its generation lock, a new
model both, so a notebook's swaps and steps land between them.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from transformers import AutoConfig

from forge_nb import step as steps
from forge_nb.config import LoraConfig
from forge_nb.engines.base import SamplingParams
from forge_nb.parallel.policy import AdamStep
from forge_nb.rl.completion import Completion
from forge_nb.rl.episode import Episode
from forge_nb.rl.rollout import Rollout
from forge_nb.rl.target_batch import Datums
from forge_nb.server.tinker.wire import BadRequest, Limits
from forge_nb.step import StepRow

if TYPE_CHECKING:
    from forge_nb.session import Session

#: Tinker's LoRA scale is alpha / rank with alpha 32 ("LoRA Without Regret"; the cookbook's lora_alpha).
LORA_ALPHA = 32.0
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class SampleJob:
    """One sample request: its prompt's tokens, how to sample (`sampling.n`: its num_samples), whether it asks
    for the prompt's logprobs, and its request id (`tag`: the samples' prompt id in the tables)."""

    prompt: list[int]
    sampling: SamplingParams
    prompt_logprobs: bool = False
    tag: str = ""


@dataclass(frozen=True)
class Sampled:
    """A sample request's answer: its completions, its prompt's logprobs (NaN first) when asked, the policy
    version that made them."""

    completions: list[Completion]
    prompt_logprobs: list[float] | None
    policy_version: int


@dataclass
class _SinceStep:
    """What Tinker's calls did since the last optim_step (its step row's)."""

    started: float = field(default_factory=time.perf_counter)
    episodes: list[Episode] = field(default_factory=list)
    generate_s: float = 0.0
    train_s: float = 0.0
    loss: float = 0.0
    tokens: int = 0
    refresh: dict[str, Any] | None = None


class TinkerMesh:
    """The Tinker API's calls on `session` (see the module docstring)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        config = session.config
        model = AutoConfig.from_pretrained(self.model_dir)
        self.limits = Limits(model.vocab_size, config.engine.max_model_len or model.max_position_embeddings)
        self.arch = model.model_type
        self.models_made = 0
        self.base_version: int | None = None  # the policy version of the fresh model (the base's outputs)
        self._since = _SinceStep()
        self._lock = threading.Lock()
        self._groups = 0

    @property
    def model_dir(self) -> str:
        """The base model's folder: what AutoTokenizer.from_pretrained loads offline."""
        return str(self.session.config.model.resolved_path())

    @property
    def lora_rank(self) -> int:
        """The trainer's LoRA rank; 0 when it trains every weight."""
        lora = self.session.config.lora
        return lora.r if lora.enabled else 0

    @property
    def lora(self) -> LoraConfig | None:
        return self.session.config.lora if self.session.config.lora.enabled else None

    def is_base_model(self, name: str) -> bool:
        """Whether `name` names the session's model: its `model.path` (a registry name or a folder) or the
        folder it resolves to."""
        from forge_nb.models.registry import resolve_model

        if name in (self.session.config.model.path, self.model_dir):
            return True
        try:
            return str(resolve_model(name).resolve()) == str(resolve_model(self.model_dir).resolve())
        except Exception:
            return False

    # -- the model -----------------------------------------------------------------------------------------
    def make_model(self, rank: int, train_attn: bool = True, train_mlp: bool = True) -> None:
        """The trainer as a fresh model of the base: a LoRA adapter of `rank` on the attention and / or MLP
        projections, or every weight (`rank` 0). A session that has trained nothing yet and already has that
        model keeps its procs; otherwise the trainer (and, when they serve differently, the generators) start
        afresh (`Fleet.remodel`) and the generators are refreshed to it. `BadRequest` for a model it cannot make."""
        s = self.session
        lora = self.lora_config(rank, train_attn, train_mlp)
        unchanged = lora == self.lora and self.models_made == 0 and s.trainer_version == 0 and s.generator_version == 0
        if not unchanged:
            if s.config.algorithm.kl_coef > 0 and (lora is None) != (self.lora is None):
                raise BadRequest(
                    f"lora_config.rank: {rank} would switch between LoRA and full fine-tuning in a session with a "
                    "reference model (algorithm.kl_coef > 0); start a session with the other kind"
                )
            with s.whole_step():
                fleet = s._require_up()
                fleet.remodel(lora)
                lora_section = {"enabled": False} if lora is None else {**lora.__dict__}
                s.config = s.state.config = s.config.updated({"lora": lora_section})
                steps.sync(s.state, fleet, "tinker: create_model")
        self.models_made += 1
        self.base_version = s.trainer_version
        with self._lock:
            self._since = _SinceStep()

    def lora_config(self, rank: int, train_attn: bool, train_mlp: bool) -> LoraConfig | None:
        """The `lora` section a Tinker LoRA config asks for (None: every weight, rank 0); `BadRequest` for one
        forge_nb cannot make."""
        if isinstance(rank, bool) or rank < 0:
            raise BadRequest(f"lora_config.rank: {rank!r}; a rank >= 1 (LoRA) or 0 (every weight trained)")
        if rank == 0:
            return None
        targets = (ATTENTION if train_attn else []) + (MLP if train_mlp else [])
        if not targets:
            raise BadRequest(
                "lora_config: train_attn and train_mlp are both false; forge_nb's adapters cover the attention and "
                "MLP projections (train_unembed is not served)"
            )
        current = self.session.config.lora  # (its dropout and how the generators serve it; Tinker's alpha)
        return LoraConfig(True, rank, LORA_ALPHA, current.dropout, targets, current.serve)

    # -- training ------------------------------------------------------------------------------------------
    def forward_backward(
        self, datums: Datums, loss: str, config: dict[str, float], forward_only: bool
    ) -> tuple[list[list[float]], list[float]]:
        """Tinker's forward_backward (or forward) of `datums` on the trainer gang -> (each datum's logprobs,
        each one's loss)."""
        s = self.session
        with s.training_lock:
            start = time.perf_counter()
            logprobs, losses = s._require_up().forward_backward(datums, loss, config, forward_only)
            seconds = time.perf_counter() - start
        with self._lock:
            self._since.train_s += seconds
            if not forward_only:
                self._since.loss += sum(losses)
                self._since.tokens += sum(datums.lengths)
        return logprobs, losses

    def optim_step(self, step: AdamStep) -> dict[str, float]:
        """Tinker's optim_step: the trainer steps and publishes the next policy version, the session counts a
        trained step (its train and step rows; the samples since the last one into the rollout log) -> metrics."""
        s, state = self.session, self.session.state
        with s.training_lock:
            start = time.perf_counter()
            metrics = s._require_up().optim_step(step)
            seconds = time.perf_counter() - start
            with self._lock:
                since, self._since = self._since, _SinceStep()
            state.step_count += 1
            version = int(metrics["policy_version"])
            train = {
                "loss": since.loss,
                "grad_norm": metrics["grad_norm"],
                "tokens": since.tokens,
                "learning_rate": step.learning_rate,
                "policy_version": version,
                "train_seconds": since.train_s + seconds,
                "publish_seconds": metrics["publish_seconds"],
                "source": "tinker",
            }
            if since.episodes:  # the samples since the last step: what the policy generated
                lengths = [e.num_tokens for e in since.episodes]
                train.update(response_length=sum(lengths) / len(lengths), response_length_max=max(lengths))
            state.metrics.emit("train", step=state.step_count, **train)
            made_by = min((e.policy_version for e in since.episodes), default=state.versions.served)
            batch = Rollout(since.episodes, made_by, math.nan, since.generate_s, 0.0)
            behind = version - 1 - made_by if since.episodes else 0
            if since.episodes:
                steps.log_batch(state, batch, [], [], behind)
            elapsed = time.perf_counter() - since.started
            row = StepRow.of(
                state.step_count, "tinker", batch, {**train, "staleness": behind}, state.versions.served, elapsed,
                since.refresh,
            )  # fmt: skip
            state.metrics.emit("step", **row.as_dict())
        return {"grad_norm": metrics["grad_norm"], "policy_version": version}

    def refresh(self, source: str) -> dict[str, Any]:
        """The generator replicas load the trainer's latest version (a "sync" row saying `source`) -> report."""
        s = self.session
        with s.generation_lock:
            report = steps.sync(s.state, s._require_up(), source)
        with self._lock:
            self._since.refresh = report
        return report

    # -- the trainer's state on disk -----------------------------------------------------------------------------
    def save_state(self, path: str) -> int:
        """Weights and optimizer state at `path` (resumable at any number of ranks) -> their policy version."""
        with self.session.training_lock:
            return self.session._require_up().save_state(path)

    def save_weights(self, path: str) -> int:
        """The weights alone at `path` (with LoRA: the adapter, in peft's format) -> their policy version."""
        with self.session.training_lock:
            return self.session._require_up().save(path, merged=False)

    def load_state(self, path: str, optimizer: bool) -> int:
        """The state `save_state` wrote (with or without its optimizer state) -> the policy version it is now."""
        with self.session.training_lock:
            return self.session._require_up().load_state(path, optimizer)

    # -- sampling ----------------------------------------------------------------------------------------------
    def sample(self, jobs: list[SampleJob]) -> list[Sampled]:
        """Every job's samples from the weights the generators serve: the jobs that sample alike in one engine
        call (a job with a seed alone, so that its seed decides its samples) -> one answer per job."""
        groups: dict[Any, list[int]] = {}
        for i, job in enumerate(jobs):
            groups.setdefault(job.sampling if job.sampling.seed is None else i, []).append(i)
        answers: list[Sampled | None] = [None] * len(jobs)
        for members in groups.values():
            for i, answer in zip(members, self._sample([jobs[i] for i in members])):
                answers[i] = answer
        return answers  # type: ignore[return-value]

    def _sample(self, jobs: list[SampleJob]) -> list[Sampled]:
        s = self.session
        with s.generation_lock:  # (held while the samples are numbered too: a rollout of the session's numbers its)
            fleet = s._require_up()
            generation = fleet.generate([job.prompt for job in jobs], jobs[0].sampling)
            scored = [job for job in jobs if job.prompt_logprobs and len(job.prompt) > 1]
            values = iter(fleet.served_logprobs([j.prompt[:1] for j in scored], [j.prompt[1:] for j in scored]))
            version = generation.policy_version
            self._record(jobs, generation.completions, version, generation.seconds)
        answers = []
        for job, completions in zip(jobs, generation.completions):
            prompt_logprobs = None
            if job.prompt_logprobs:
                prompt_logprobs = [math.nan, *(next(values) if len(job.prompt) > 1 else [])]
            answers.append(Sampled(completions, prompt_logprobs, version))
        return answers

    def _record(self, jobs: list[SampleJob], completions: list[list[Completion]], version: int, seconds: float) -> None:
        """The samples into the replay buffer and the step's tally, and a "rollout" row."""
        state, tokenizer = self.session.state, self.session.tokenizer
        episodes = []
        with self._lock:
            for job, group in zip(jobs, completions):
                prompt = tokenizer.decode(job.prompt)
                self._groups += 1
                for c in group:
                    episodes.append(
                        Episode(
                            sample_id=state.next_sample_id,
                            group_id=-self._groups,  # a request's samples: negative, apart from the step's groups
                            prompt_id=f"tinker:{job.tag}",
                            prompt=prompt,
                            completion=c.text,
                            target="",
                            prompt_ids=job.prompt,
                            completion_ids=c.token_ids,
                            logprobs=c.logprobs,
                            finish_reason=c.finish_reason,
                            policy_version=version,
                            reward=math.nan,
                        )
                    )
                    state.next_sample_id += 1
            self._since.episodes.extend(episodes)
            self._since.generate_s += seconds
        state.buffer.add(episodes)
        batch = Rollout(episodes, version, math.nan, seconds, 0.0)
        state.metrics.emit("rollout", step=state.step_count, source="tinker", **batch.summary())


def sampling_params(params: Any, num_samples: int, default_max_tokens: int) -> SamplingParams:
    """Tinker's `SamplingParams` (the SDK's pydantic model) -> the engine's. ``stop``: strings, or token ids
    (each ends a sample, and stays in it as EOS does); None: EOS only; ``[]``: not even EOS. ``max_tokens``
    None: the session's engine.max_tokens. ``top_k`` -1: no limit."""
    stop = params.stop
    strings: tuple[str, ...] = ()
    ids: tuple[int, ...] = ()
    if isinstance(stop, str):
        strings = (stop,)
    elif stop is not None:
        items = list(stop)
        if all(isinstance(x, str) for x in items):
            strings = tuple(items)
        elif all(isinstance(x, int) and not isinstance(x, bool) for x in items):
            ids = tuple(items)
        else:
            raise BadRequest("sampling_params.stop: strings or token ids, not both")
    if params.temperature < 0:
        raise BadRequest(f"sampling_params.temperature: {params.temperature}; it must be >= 0")
    if not 0 < params.top_p <= 1:
        raise BadRequest(f"sampling_params.top_p: {params.top_p}; it must be in (0, 1]")
    if params.top_k == 0 or params.top_k < -1:
        raise BadRequest(f"sampling_params.top_k: {params.top_k}; -1 (no limit) or a positive number")
    max_tokens = default_max_tokens if params.max_tokens is None else params.max_tokens
    if max_tokens < 1:
        raise BadRequest(f"sampling_params.max_tokens: {max_tokens}; it must be >= 1")
    if num_samples < 1:
        raise BadRequest(f"num_samples: {num_samples}; it must be >= 1")
    return replace(
        SamplingParams(num_samples, params.temperature, params.top_p, max_tokens, params.seed, strings),
        top_k=max(params.top_k, 0),
        stop_token_ids=ids,
        ignore_eos=stop is not None and not strings and not ids,
    )
