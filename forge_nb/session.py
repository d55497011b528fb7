"""Session: the kernel-held controller of one RL post-training run on a Monarch mesh.

It reads like the training loop it drives::

    s = Session.up()            # generator, trainer and reward actors in their own procs
    r = s.rollout()             # generate P x G samples, score them, group-relative advantages
    m = s.train(r)              # one GRPO step on the trainer; policy version v -> v + 1
    w = s.sync()                # generator pulls v + 1 (/dev/shm on this host, Monarch RDMA across hosts)
    s.down()                    # every proc stopped

The actor calls are in `mesh.roles`, the pure steps between them in `rl.rollout`, the background
runs in `loop`, and every reward / loss version in `live.manager`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer

from forge_nb import evaluation
from forge_nb.actors.trainer import TrainResult
from forge_nb.config import Config
from forge_nb.engines.base import SamplingParams
from forge_nb.export import export_bundle
from forge_nb.live.capture import LiveCode
from forge_nb.live.manager import KINDS, LiveCodeManager
from forge_nb.live.registry import Registry
from forge_nb.loop import AsyncRun, BackgroundRun, RunSlot, StepRow, sync_step
from forge_nb.mesh import lifecycle
from forge_nb.mesh.roles import Roles
from forge_nb.mesh.slurm import SlurmError
from forge_nb.metrics import MetricsStream
from forge_nb.rewards.batch import reward_batch
from forge_nb.rl import rollout as pipeline
from forge_nb.rl.episode import Episode
from forge_nb.rl.replay import ReplayBuffer
from forge_nb.rl.rollout import EmptyTrainBatch, Rollout
from forge_nb.tasks import Problem, make_task
from forge_nb.tasks.data import take_task_data
from forge_nb.tasks.prompts import PromptFormat, check_lengths


class SessionError(RuntimeError):
    """The session cannot do what was asked (not up, an actor failed to start, ...)."""


class Session:
    """Owns the mesh, the task stream, the replay buffer, live code and the metrics stream of one run."""

    def __init__(self, config: Config, data: Any = None) -> None:
        self.config = config.validate()
        self.metrics_stream = MetricsStream()
        self.buffer = ReplayBuffer()
        self.task = make_task(config.task, config.seed, data)  # your rows (`data`), task.path, or a bundled task
        self.step_count = 0  # trained batches
        self.rollout_count = 0  # rollouts made: each samples with its own seed
        self._next_eval = config.eval.every
        self._next_sample_id = 0
        self.actors: Roles | None = None
        self.trainer_version = 0  # policy version of the trainer's weights (the latest published)
        self.generator_version = 0  # policy version the generator serves (as of the last sync)
        self._dashboards: list = []
        self.live_code = LiveCodeManager(config, host=self)
        self.reward_errors: list[dict] = []
        # The generator side (rollout, sync, reward swaps) and the trainer side (train, loss swaps) each
        # hold their lock for a whole batch, so swaps and calls from cells land between batches; a
        # synchronous step holds both, the async run lets the two sides overlap.
        self.generation_lock = threading.RLock()
        self.training_lock = threading.RLock()
        self.runs = RunSlot()

    @classmethod
    def up(cls, config: Config | None = None, **overrides: Any) -> Session:
        """Validate the config and the data, start every actor and wait until each one is ready.
        ``task=`` takes a bundled task's name, rows (list of dicts, DataFrame, Dataset) or a file."""
        overrides, data = take_task_data(overrides)
        session = cls((config or Config()).updated(overrides), data)
        session._start()
        return session

    def _start(self) -> None:
        cfg, model_dir = self.config, str(self.config.model.resolved_path())
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.prompts = PromptFormat(self.tokenizer, cfg.task.prompt_format, cfg.task.system_prompt)
        context = cfg.engine.max_model_len or AutoConfig.from_pretrained(model_dir).max_position_embeddings
        check_lengths(self.task.known_problems(), self.prompts, context, cfg.engine.max_tokens)  # before any proc
        self.engine_name = cfg.engine_name()
        rewards, loss = self.live_code.registry.members("reward"), self.live_code.live("loss").code
        try:
            self.actors = Roles.start(cfg, self.engine_name, self.tokenizer.pad_token_id, rewards, loss, self._event)
            self.actors.judges.connect(self.metrics_stream)  # "judge" rows: the judge's calls and timings
            lifecycle.register(self)  # after the spawns: our exit hook then runs before the ones Monarch adds
            self.actors.wait_ready()
            self.actors.attach_weights(cfg.weights.transport)
            self.live_code.connect(self.actors, self.generation_lock, self.training_lock)
        except Exception as e:
            self.down()
            cause = (
                f"the Slurm mesh failed to start: {e}"
                if isinstance(e, SlurmError)
                else f"the mesh failed to start ({type(e).__name__}): {e}"
            )
            raise SessionError(f"forge_nb: {cause}") from (None if isinstance(e, SlurmError) else e)

    def _event(self, role: str, what: str) -> None:
        """Something happened to the mesh (a proc replaced, ...): on the metrics stream, in `status()`."""
        self.metrics_stream.emit("event", step=self.step_count, role=role, what=what)

    @property
    def is_up(self) -> bool:
        return self.actors is not None

    def down(self) -> None:
        """Stop every proc this session started. Safe to call twice."""
        self.runs.stop()
        for board in self._dashboards:
            board.close()
        actors, self.actors = self.actors, None
        lifecycle.unregister(self)
        if actors is None:
            return
        errors = actors.stop()
        if errors:
            raise SessionError("forge_nb: some procs did not stop cleanly: " + "; ".join(errors))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _require_up(self) -> Roles:
        if self.actors is None:
            raise SessionError("forge_nb: the session is down; start one with forge_nb.up()")
        return self.actors

    def sampling(self, n: int | None = None, temperature: float | None = None) -> SamplingParams:
        """The sampling of the next rollout: G samples per prompt, a seed of its own."""
        seed = self.config.seed * 1_000_003 + self.rollout_count
        return self.config.engine.sampling(n or self.config.algorithm.group_size, seed, temperature)

    def rollout(self, problems: list[Problem] | None = None) -> Rollout:
        """Generate G samples for each of P prompts, score them, compute group-relative advantages."""
        with self.generation_lock:
            actors = self._require_up()
            return self._rollout(actors, problems or self.task.sample(self.config.algorithm.prompts_per_step))

    def _rollout(self, actors: Roles, problems: list[Problem]) -> Rollout:
        a = self.config.algorithm
        sampling = self.sampling()
        self.rollout_count += 1
        texts, ids = self.prompts.render_all(problems)
        generation = actors.generate(ids, sampling)
        first_id, version = self._next_sample_id, generation.policy_version
        episodes = pipeline.make_episodes(problems, texts, generation.completions, version, first_id)
        self._next_sample_id += len(episodes)
        reference = actors.reference_logprobs(episodes)  # runs while the reward procs score
        start = time.perf_counter()
        for part, scores in actors.score(reward_batch(episodes, self.step_count)):
            self.reward_errors += pipeline.apply_scores(episodes[part], scores)
        score_s = time.perf_counter() - start
        reference_s = Roles.attach_reference(episodes, reference)
        if a.overlong_cache:
            pipeline.add_overlong_penalty(episodes, self.config.engine.max_tokens, a.overlong_cache)
        pipeline.assign_advantages(episodes, sampling.n, a.normalize_std, a.group_std == "sample")
        accuracy = sum(self.task.verify(e.completion, e.target) for e in episodes) / len(episodes)
        self.buffer.add(episodes)
        rollout = Rollout(episodes, generation.policy_version, accuracy, generation.seconds, score_s, reference_s)
        epoch = getattr(self.task, "epoch", 0)
        self.metrics_stream.emit("rollout", step=self.step_count, epoch=epoch, **rollout.summary())
        return rollout

    def probe_samples(self, n: int) -> list[Episode]:
        """`n` fresh samples of held-out prompts for validating live code before the first rollout."""
        return evaluation.probe_samples(self._require_up(), self.task, self.prompts, self.sampling(n=4), n)

    def train(self, rollout: Rollout) -> dict[str, Any]:
        """One optimizer step on `rollout` -> metrics (loss, grad_norm, policy_version, train_seconds, ...).
        Counts one trained batch (`step_count`)."""
        with self.training_lock:
            actors = self._require_up()
            try:
                episodes = pipeline.train_subset(rollout.episodes, self.config.algorithm.dynamic_sampling)
            except EmptyTrainBatch as e:
                raise SessionError(f"forge_nb: {e}") from None
            if episodes:
                result = actors.train_step(episodes)
                self.trainer_version = result.policy_version
                for e in episodes:
                    e.loss_version = result.loss_version
            else:  # dynamic sampling left nothing: no step, nothing published
                stats = {"loss": 0.0, "grad_norm": 0.0, "tokens": 0, "skipped": True}
                result = TrainResult(self.trainer_version, self.live_code.live("loss").version, stats, 0.0, 0.0)
            self.metrics_stream.emit("train", step=self.step_count, **result.as_dict())
            self.step_count += 1
            return result.as_dict()

    def sync(self) -> dict[str, Any]:
        """Refresh the generator with the trainer's latest published version -> report: version,
        previous_version, bytes, seconds, transfer_seconds, total_seconds, gbps, skipped, transport."""
        with self.generation_lock:
            actors = self._require_up()
            start = time.perf_counter()
            report = actors.refresh(self.trainer_version)
            self.generator_version = report.version
            row = {**report.as_dict(), "total_seconds": time.perf_counter() - start}
            self.metrics_stream.emit("sync", step=self.step_count, **row)
            return row

    def step(self, n: int = 1, progress: bool = True) -> pd.DataFrame:
        """n x (rollout, train, sync) -> one row per step (reward, accuracy, tokens/s, phase times, GB/s).
        A progress bar shows from 5 steps on, unless `progress=False`."""
        bar = tqdm(range(n), desc="forge_nb step", disable=n < 5 or not progress, leave=False)
        rows = [sync_step(self).as_dict() for _ in bar]
        return pd.DataFrame(rows, columns=list(StepRow.__dataclass_fields__)).set_index("step")

    @contextmanager
    def whole_step(self) -> Iterator[None]:
        """Hold both sides: no swap or call from another thread lands until the block ends."""
        with self.generation_lock, self.training_lock:
            yield

    @property
    def background(self) -> BackgroundRun | AsyncRun | None:
        """The latest background run (its `state`, `done` steps and `error`), if any."""
        return self.runs.current

    def run(self, steps: int | None = None, mode: str = "sync", max_staleness: int = 1) -> BackgroundRun | AsyncRun:
        """Train in the background (`steps` trainer steps, or until `stop()`); the kernel stays
        responsive and swaps, syncs and other calls from cells apply between batches.

        mode="sync": step after step (rollout, train, sync). mode="async": generation and training
        overlap; batches more than `max_staleness` policy versions old are dropped (see `loop`).
        """
        self._require_up()
        return self.runs.start(self, steps, mode, max_staleness)

    def pause(self) -> None:
        """Pause the background run after the step in flight; `resume()` goes on."""
        self.runs.pause()

    def resume(self) -> None:
        self.runs.resume()

    def stop(self) -> None:
        """Stop the background run after the step in flight (the mesh stays up)."""
        self.runs.stop()

    def staleness(self) -> pd.Series:
        """Histogram of trained batches by staleness (trainer version - generating version)."""
        steps = self.metrics_stream.to_pandas("step")
        return steps.staleness.value_counts().sort_index() if not steps.empty else pd.Series(dtype=int)

    def evaluate(self, max_tokens: int | None = None) -> dict[str, float]:
        """The held-out prompts under the generator's current weights, greedy or sampled (`eval.*`):
        heldout_accuracy (the task's verifier), eval_reward and each reward member's mean, ..."""
        with self.generation_lock:
            actors = self._require_up()
            result = evaluation.evaluate(actors, self.task, self.prompts, self.config, self.step_count, max_tokens)
            self.metrics_stream.emit("eval", step=self.step_count, **result)
            return result

    def maybe_evaluate(self) -> dict[str, float] | None:
        """Evaluate when `eval.every` trained steps have passed since the last time (None otherwise)."""
        every = self.config.eval.every
        if not every or self.step_count < self._next_eval:
            return None
        self._next_eval = (self.step_count // every + 1) * every
        return self.evaluate()

    @property
    def has_reference(self) -> bool:
        return self.actors is not None and self.actors.reference is not None

    @property
    def pids(self) -> dict[str, list[int]]:
        """Process ids of each role's procs."""
        return self.actors.pids if self.actors is not None else {}

    @property
    def registry(self) -> Registry:
        """Every reward and loss version (see `versions()` for a table)."""
        return self.live_code.registry

    def dashboard(self):
        """A live ipywidgets dashboard of this session (display it, or let the cell return it)."""
        from forge_nb.notebook.dashboard import Dashboard

        board = Dashboard(self)
        self._dashboards.append(board)
        return board.widget

    def samples(self, n: int = 16) -> pd.DataFrame:
        """The last `n` samples with rewards, advantages and versions."""
        from forge_nb.notebook.tables import samples_table

        return samples_table(self, n)

    @property
    def metrics(self) -> pd.DataFrame:
        """Every metrics row so far (all kinds) as a DataFrame."""
        return self.metrics_stream.to_pandas()

    def save_checkpoint(self, path: str | Path) -> int:
        """Write the trainer's current weights and the tokenizer as an HF model directory -> version."""
        actors = self._require_up()
        with self.training_lock:
            version = actors.save(str(path))
        self.tokenizer.save_pretrained(str(path))
        return version

    def export(self, path: str | Path, steps: int = 100) -> Path:
        """Write a standalone script + sbatch file that reproduce this session (config, current
        weights, live reward and loss) without a notebook -> the directory. See `forge_nb.export`."""
        self._require_up()
        live = {kind: (self.live_code.live(kind).version, self.live_code.registry.members(kind)) for kind in KINDS}
        origin = {"policy_version": self.trainer_version, "steps": self.step_count}
        checkpoint = self.save_checkpoint if self.trainer_version > 0 else None
        return export_bundle(path, self.config, live, steps, origin, checkpoint)

    def checksums(self) -> dict[str, tuple[int, str]]:
        """(version, weights checksum) of the trainer and the generator: equal after a sync with the
        torch engine; vLLM serves its own fused layout (equal across replicas, not the trainer's)."""
        return self._require_up().checksums()

    def status(self) -> dict[str, Any]:
        """Mesh, actors and versions, as a dict (printable in a notebook)."""
        if self.actors is None:
            return {"up": False, "steps": self.step_count}
        run = self.runs.current
        return {
            "up": True,
            **self.actors.describe(),
            "steps": self.step_count,
            "policy_version": {"trainer": self.trainer_version, "generator": self.generator_version},
            "samples": self.buffer.added,
            "reward_version": self.live_code.live("reward").version,
            "loss_version": self.live_code.live("loss").version,
            "run": None if run is None else {"state": run.state, "steps_done": run.done, "error": run.error},
            "events": [{k: r[k] for k in ("time", "role", "what")} for r in self.metrics_stream.rows("event")[-5:]],
            "reward_errors": len(self.reward_errors),
            "last_reward_errors": self.reward_errors[-3:],
            "model": str(self.config.model.resolved_path()),
        }

    def set_reward(
        self,
        fn: Callable | str | LiveCode | None = None,
        *,
        version: int | None = None,
        name: str | None = None,
        weight: float | None = None,
    ) -> int:
        """Validate `fn` (a function, a cell's source, or captured code) on recent samples, give it the
        next reward version and make it live in every reward actor from the next batch -> version.
        Several rewards can be live: `name` adds or replaces one (default "reward"), `weight` sets its
        weight in the trained sum (0: logged only; `fn` may be omitted to change just the weight).
        `version=N` makes an earlier set live again (rollback). Bad code raises `LiveCodeError` and the
        live version stays."""
        self._require_up()
        return self.live_code.set("reward", fn, version, name=name, weight=weight)

    def remove_reward(self, name: str) -> int:
        """Take reward `name` out of the live set -> the new reward version."""
        self._require_up()
        return self.live_code.remove("reward", name)

    def set_loss(self, fn: Callable | str | LiveCode | None = None, *, version: int | None = None) -> int:
        """As `set_reward`, for the loss the trainer minimises (validated forward and backward)."""
        self._require_up()
        return self.live_code.set("loss", fn, version)

    def versions(self, kind: str | None = None) -> pd.DataFrame:
        """Every reward / loss version (and rejected candidate): source, time, validation, status."""
        return self.live_code.versions(kind)

    def rescore(self, reward: Callable | str | int, n: int = 256) -> pd.DataFrame:
        """Score the last `n` samples with another reward (a function, source or version number),
        without touching the live one -> DataFrame of old and new rewards side by side."""
        return self.live_code.rescore(reward, n)

    def recent_samples(self, n: int) -> list[Episode]:
        return self.buffer.recent(n)
