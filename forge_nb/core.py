"""The engine room of a session: its actors, counters and versions, and the one step they take.

`SessionCore` starts the mesh (`mesh.roles`), keeps what a run is made of (the task stream, the
replay buffer, live code, the metrics stream, the step and rollout counters, the policy versions of
the trainer and the generator), and does rollout -> train -> sync: the actor calls, with the pure
pipeline (`rl.rollout`) between them. `session.Session` is the facade a notebook uses on top of it.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
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
from forge_nb.live.manager import LiveCodeManager
from forge_nb.live.registry import Registry
from forge_nb.loop import RunSlot, StepRow, sync_step
from forge_nb.mesh import lifecycle
from forge_nb.mesh.roles import Roles, StartFrom
from forge_nb.mesh.slurm import SlurmError
from forge_nb.metrics import MetricsStream
from forge_nb.rewards.batch import reward_batch
from forge_nb.rl import rollout as pipeline
from forge_nb.rl.episode import Episode
from forge_nb.rl.replay import ReplayBuffer
from forge_nb.rl.rollout import EmptyTrainBatch, Rollout
from forge_nb.run import checkpoint
from forge_nb.run.rollout_log import Batch, RolloutLog
from forge_nb.run.tracking import Trackers, make_trackers
from forge_nb.tasks import Problem, make_task
from forge_nb.tasks.prompts import PromptFormat, check_lengths
from forge_nb.watch import StepView, Watch


class SessionError(RuntimeError):
    """The session cannot do what was asked (not up, an actor failed to start, ...)."""


class SessionCore:
    """The mesh, the task stream, the replay buffer, live code, counters, versions and the metrics stream
    of one run; rollout, train, sync and step."""

    def __init__(self, config: Config, data: Any = None) -> None:
        self.config = config.validate()
        self.metrics_stream = MetricsStream()
        self.buffer = ReplayBuffer()
        self.task = make_task(config.task, config.seed, data)  # your rows (`data`), task.path, or a bundled task
        self.step_count = 0  # trained batches
        self.rollout_count = 0  # rollouts made: each samples with its own seed
        self._next_eval, self._next_checkpoint = config.eval.every, config.checkpoint.every
        self.run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}-{id(self) % 10_000:04d}"
        runs = Path(config.log.dir or os.environ.get("FORGE_NB_RUNS") or "forge_runs")
        self.run_dir = runs / self.run_id  # the rollout log, trackers, periodic checkpoints
        self.checkpoint_dir = Path(config.checkpoint.dir) if config.checkpoint.dir else self.run_dir / "checkpoints"
        self.rollout_log: RolloutLog | None = None
        self.trackers = Trackers([])
        self.watcher: Watch | None = None
        self._watch_fired = False
        self.saved: list[tuple[int, Path]] = []  # (step, path) of each checkpoint this session wrote
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

    def _start(self, start: StartFrom | None = None) -> None:
        cfg, model_dir = self.config, str(self.config.model.resolved_path())
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.prompts = PromptFormat(self.tokenizer, cfg.task.prompt_format, cfg.task.system_prompt)
        context = cfg.engine.max_model_len or AutoConfig.from_pretrained(model_dir).max_position_embeddings
        check_lengths(self.task.known_problems(), self.prompts, context, cfg.engine.max_tokens)  # before any proc
        self.engine_name = cfg.engine_name()
        rewards, loss = self.live_code.registry.members("reward"), self.live_code.live("loss").code
        self._open_run_dir()
        try:
            self.actors = Roles.start(
                cfg, self.engine_name, self.tokenizer.pad_token_id, rewards, loss, self._event, start
            )
            if cfg.checkpoint.on_trainer_failure == "restore":
                self.actors.restore_from = self.last_checkpoint
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

    def _open_run_dir(self) -> None:
        """The rollout log and the trackers the config turns on, in the run directory (before any proc
        starts: a tracker that cannot start fails `up` at once)."""
        log = self.config.log
        try:
            trackers = make_trackers(log, self.run_dir, self.config.to_dict(), self.run_id)
        except Exception as e:
            raise SessionError(f"forge_nb: a tracker the config turns on (log.*) did not start: {e}") from e
        self.trackers = Trackers(trackers)
        if log.samples:
            self.rollout_log = RolloutLog(self.run_dir / "rollouts", log.max_mb)
        if self.trackers:
            self._unsubscribe_trackers = self.metrics_stream.subscribe(self.trackers.on_row)

    def _close_run_dir(self) -> None:
        if self.rollout_log is not None:
            self.rollout_log.close()
        if self.trackers:
            self._unsubscribe_trackers()
            self.trackers.close()
            self.trackers = Trackers([])

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
        self._close_run_dir()
        if actors is None:
            return
        errors = actors.stop()
        if errors:
            raise SessionError("forge_nb: some procs did not stop cleanly: " + "; ".join(errors))

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
        reference_s = actors.attach_reference(episodes, reference)
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
            staleness = self.trainer_version - rollout.policy_version
            if episodes:
                result = actors.train_step(episodes)
                self.trainer_version = result.policy_version
                for e in episodes:
                    e.loss_version = result.loss_version
            else:  # dynamic sampling left nothing: no step, nothing published
                stats = {"loss": 0.0, "grad_norm": 0.0, "tokens": 0, "skipped": True}
                result = TrainResult(self.trainer_version, self.live_code.live("loss").version, stats, 0.0, 0.0)
            self.step_count += 1  # this batch is step `step_count`: its train row, step row and log file
            self.metrics_stream.emit("train", step=self.step_count, **result.as_dict())
            self._log_batch(rollout, episodes, result.token_logprobs or [], staleness)
            return result.as_dict()

    def _log_batch(
        self, rollout: Rollout, trained: list[Episode], logprobs: list, staleness: int, dropped: bool = False
    ) -> None:
        """The batch into the rollout log (and the trackers' samples tables), as step `step_count`."""
        ids = [e.sample_id for e in trained]
        batch = Batch(rollout.episodes, self.step_count, staleness, frozenset(ids), dict(zip(ids, logprobs)), dropped)
        if self.rollout_log is not None:
            self.rollout_log.append(batch)
        if self.trackers and not dropped:
            self.trackers.on_batch(self.step_count, rollout.to_pandas())

    def on_dropped(self, rollout: Rollout, staleness: int) -> None:
        """A batch the async run dropped (too stale): logged, never trained."""
        self._log_batch(rollout, [], [], staleness, dropped=True)

    def after_step(self, row: StepRow, rollout: Rollout, train: dict[str, Any]) -> None:
        """At the step boundary: evaluation and a checkpoint when due; the trackers hear of new live-code
        versions; the watch checks its conditions and, when one fires, pauses the run."""
        self.maybe_evaluate()
        self.maybe_checkpoint()
        if self.trackers:
            self.trackers.on_versions(self.step_count, self.live_code.registry.records)
        if self.watcher is not None:
            weights = {n: m.weight for n, m in self.live_code.registry.members("reward").items()}
            here = threading.current_thread() is threading.main_thread()  # s.step in a cell, not a run
            if self.watcher.check(StepView(row.as_dict(), rollout, train, weights), here):
                self._watch_fired = True
                self.runs.pause()

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
        rows, self._watch_fired = [], False
        for _ in bar:
            rows.append(sync_step(self).as_dict())
            if self._watch_fired:  # a watch fired: stop here, as a breakpoint would
                break
        return pd.DataFrame(rows, columns=list(StepRow.__dataclass_fields__)).set_index("step")

    @contextmanager
    def whole_step(self) -> Iterator[None]:
        """Hold both sides: no swap or call from another thread lands until the block ends."""
        with self.generation_lock, self.training_lock:
            yield

    def evaluate(self, max_tokens: int | None = None, greedy: bool | None = None) -> dict[str, float]:
        """The held-out prompts under the generator's current weights, greedy or sampled (`eval.*`, or
        `greedy` for this call): heldout_accuracy (the task's verifier), eval_reward, per member, ..."""
        with self.generation_lock:
            args = self.task, self.prompts, self.config, self.step_count, max_tokens, greedy
            result = evaluation.evaluate(self._require_up(), *args)
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

    def recent_samples(self, n: int) -> list[Episode]:
        """The newest `n` samples (or fewer)."""
        return self.buffer.recent(n)

    def save(self, path: str | Path) -> Path:
        """Write a checkpoint of this session at `path` (between batches) -> its folder: weights,
        optimizer and RNG, counters and versions, the task stream's position, the buffer, every
        reward and loss version, the metrics (`run.checkpoint`). `forge_nb.resume(path)` goes on from it."""
        with self.whole_step():
            actors = self._require_up()
            state = {
                "step_count": self.step_count,
                "rollout_count": self.rollout_count,
                "next_sample_id": self._next_sample_id,
                "next_eval": self._next_eval,
                "next_checkpoint": self._next_checkpoint,
                "trainer_version": self.trainer_version,
                "generator_version": self.generator_version,
                "reward_version": self.live_code.live("reward").version,
                "loss_version": self.live_code.live("loss").version,
                "reward_errors": self.reward_errors,
                "task": self.task.state(),
            }
            rows = getattr(self.task, "rows", None)
            data = {"train": rows("train"), "eval": rows("eval")} if rows and not self.config.task.path else None

            def weights(folder: Path) -> None:
                actors.save_weights(folder, generator_too=self.generator_version != self.trainer_version)
                for sub in ("trainer", "generator"):
                    if (folder / sub).is_dir():
                        self.tokenizer.save_pretrained(folder / sub)
                        _copy_configs(folder / "trainer", folder / sub)

            out = checkpoint.write(
                path,
                state,
                self.config.to_dict(),
                data,
                self.live_code.registry.to_records(),
                self.buffer.recent(self.buffer.added),
                self.buffer.sample_ids(),
                self.metrics_stream.rows(),
                weights,
            )
            self.saved.append((self.step_count, out))
            return out

    def _load(self, ckpt: checkpoint.Checkpoint) -> StartFrom:
        """Put a checkpoint's kernel-side state in place -> where the actors start from."""
        st = ckpt.state
        self.step_count, self.rollout_count, self._next_sample_id = (
            st["step_count"],
            st["rollout_count"],
            st["next_sample_id"],
        )
        self._next_eval, self._next_checkpoint = st["next_eval"], st["next_checkpoint"]
        self.trainer_version, self.generator_version = st["trainer_version"], st["generator_version"]
        self.reward_errors = st["reward_errors"]
        self.task.load_state(st["task"])
        self.buffer = ReplayBuffer.restored(ckpt.episodes, ckpt.sample_ids)
        self.metrics_stream = MetricsStream(ckpt.metrics)
        self.live_code.registry = Registry.from_records(ckpt.live)
        return StartFrom(
            str(ckpt.trainer_dir),
            self.trainer_version,
            st["loss_version"],
            str(ckpt.generator_dir),
            self.generator_version,
            st["reward_version"],
        )

    def maybe_checkpoint(self) -> Path | None:
        """Write a periodic checkpoint when `checkpoint.every` trained steps have passed (None otherwise);
        the oldest beyond `checkpoint.keep` are deleted."""
        every = self.config.checkpoint.every
        if not every or self.step_count < self._next_checkpoint:
            return None
        self._next_checkpoint = (self.step_count // every + 1) * every
        out = self.save(self.checkpoint_dir / checkpoint.PERIODIC.format(step=self.step_count))
        checkpoint.prune(self.checkpoint_dir, self.config.checkpoint.keep)
        self.saved = [(step, p) for step, p in self.saved if p.is_dir()]
        return out

    def last_checkpoint(self) -> Path | None:
        """The newest checkpoint this session wrote (saved or periodic) that still exists."""
        found = [(step, p) for step, p in self.saved if p.is_dir()]
        return max(found, key=lambda s: s[0])[1] if found else None


def _copy_configs(source: Path, folder: Path) -> None:
    """The model's config files beside weights saved without them (the generator's served weights)."""
    for name in ("config.json", "generation_config.json"):
        if (source / name).is_file() and not (folder / name).is_file():
            shutil.copyfile(source / name, folder / name)
