"""Session: the kernel-held controller of one RL post-training run on a Monarch mesh.

It reads like the training loop it drives::

    s = Session.up()            # generator, trainer and reward actors in their own procs
    r = s.rollout()             # generate P x G samples, score them, group-relative advantages
    m = s.train(r)              # one GRPO step on the trainer; policy version v -> v + 1
    w = s.sync()                # generator pulls v + 1 (/dev/shm on this host, Monarch RDMA across hosts)
    s.down()                    # every proc stopped
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from monarch.actor import Future
from tqdm.auto import tqdm
from transformers import AutoTokenizer

from forge_nb.actors.generator import Generator
from forge_nb.actors.reference import Reference
from forge_nb.actors.reward import RewardWorker
from forge_nb.actors.trainer import Trainer
from forge_nb.async_run import AsyncRun
from forge_nb.background import BackgroundRun
from forge_nb.config import Config
from forge_nb.engines.base import SamplingParams
from forge_nb.live import swap
from forge_nb.live.builtin import builtin_loss, builtin_reward
from forge_nb.live.capture import LiveCode
from forge_nb.live.probe import reward_batch
from forge_nb.live.registry import Registry
from forge_nb.mesh import lifecycle
from forge_nb.mesh.calls import wait
from forge_nb.mesh.local import LocalMesh
from forge_nb.mesh.slurm import SlurmError, SlurmMesh
from forge_nb.metrics import MetricsStream
from forge_nb.rl.advantages import group_relative, overlong_penalty
from forge_nb.rl.episode import Episode
from forge_nb.rl.replay import ReplayBuffer
from forge_nb.rollout import Rollout
from forge_nb.tasks import Problem, make_task


class SessionError(RuntimeError):
    """The session cannot do what was asked (not up, an actor failed to start, ...)."""


class Session:
    """Owns the mesh, the task stream, the replay buffer and the metrics stream of one run."""

    def __init__(self, config: Config) -> None:
        self.config = config.validate()
        self.metrics_stream = MetricsStream()
        self.buffer = ReplayBuffer()
        self.task = make_task(config.task.name, config.seed, max_digits=config.task.max_digits,
                              eval_size=config.task.eval_size)  # fmt: skip
        self.step_count = 0
        self._next_sample_id = 0
        self._mesh: LocalMesh | SlurmMesh | None = None
        self._trainer_version = 0
        self._generator_version = 0
        self._dashboards: list = []
        self.registry = Registry()
        self.registry.add_builtin("reward", builtin_reward(config.task, config.seed))
        self.registry.add_builtin("loss", builtin_loss(config.algorithm))
        self.reward_errors: list[dict] = []
        # The generator side (rollout, sync, reward swaps) and the trainer side (train, loss swaps) each
        # hold their lock for a whole batch, so swaps and calls from cells land between batches; a
        # synchronous step holds both, the async run lets the two sides overlap.
        self.generation_lock = threading.RLock()
        self.training_lock = threading.RLock()
        self._run: BackgroundRun | None = None
        self.reference = None  # the frozen reference-model actor, when algorithm.kl_coef > 0

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def up(cls, config: Config | None = None, **overrides: Any) -> Session:
        """Validate the config, start every actor and wait until each one is ready."""
        session = cls((config or Config()).updated(overrides))
        session._start()
        return session

    def _start(self) -> None:
        cfg, model_dir = self.config, str(self.config.model.resolved_path())
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._mesh = mesh = self._make_mesh()
        threads = cfg.mesh.threads_per_proc
        try:
            self.engine_name = cfg.engine.resolved_name
            self.generator = mesh.spawn("generator", Generator, model_dir, cfg.serve_dtype, threads,
                                        self.engine_name, self._engine_options(),
                                        procs=cfg.mesh.generator_procs)  # fmt: skip
            self.trainer = mesh.spawn("trainer", Trainer, model_dir, cfg.model.dtype, threads, cfg.algorithm,
                                      self.tokenizer.pad_token_id, cfg.engine.temperature,
                                      self.registry.live("loss").code, cfg.serve_dtype,
                                      cfg.weights.chunk_mb, cfg.model.resolved_device)  # fmt: skip
            self.rewards = mesh.spawn("reward", RewardWorker, self.registry.live("reward").code, 0,
                                      cfg.live.timeout_s, procs=cfg.mesh.reward_procs)  # fmt: skip
            if cfg.algorithm.kl_coef > 0:
                self.reference = mesh.spawn("reference", Reference, model_dir, cfg.model.dtype, threads,
                                            self.tokenizer.pad_token_id, cfg.engine.temperature,
                                            cfg.model.resolved_device)  # fmt: skip
            # Registered after the spawns, so our exit hook runs before the ones Monarch adds there.
            lifecycle.register(self)
            self.pids = self._wait_ready()
            manifest = wait(self.trainer.weights_manifest.call_one())
            transports = set(wait(self.generator.attach.call(manifest, cfg.weights.transport)).values())
            self.weights_transport = "+".join(sorted(transports))
            wait(self.trainer.unlink_shared_memory.call_one())
        except Exception as e:
            self.down()
            raise SessionError(f"forge_nb: the mesh failed to start ({type(e).__name__}): {e}") from e

    def _make_mesh(self) -> LocalMesh | SlurmMesh:
        """This host's procs, or a Slurm job's nodes (submitted or attached; waits until it runs)."""
        if self.config.mesh.kind == "local":
            return LocalMesh()
        try:
            return SlurmMesh(self.config.slurm)
        except SlurmError as e:
            raise SessionError(f"forge_nb: the Slurm mesh failed to start: {e}") from None

    def _engine_options(self) -> dict[str, Any]:
        if self.engine_name != "vllm":
            return {}
        e = self.config.engine
        return {"max_model_len": e.max_model_len or None, "seed": self.config.seed, "kv_cache_mb": e.kv_cache_mb,
                "gpu_memory_utilization": e.gpu_memory_utilization}  # fmt: skip

    def _wait_ready(self) -> dict[str, list[int]]:
        """Ask every actor for its pid: returns once each constructor has finished (or raises its error)."""
        pids = {}
        roles = [("generator", self.generator), ("trainer", self.trainer), ("reward", self.rewards)]
        roles += [("reference", self.reference)] if self.reference is not None else []
        with tqdm(total=len(roles), desc="forge_nb up: starting actors", leave=False) as bar:
            for role, mesh in roles:
                bar.set_postfix_str(f"generator ({self.engine_name} engine)" if role == "generator" else role)
                pids[role] = [pid for _, pid in wait(mesh.pid.call()).items()]
                bar.update()
        return pids

    @property
    def is_up(self) -> bool:
        return self._mesh is not None

    def down(self) -> None:
        """Stop every proc this session started. Safe to call twice."""
        if self._run is not None:
            self._run.stop()
        for board in self._dashboards:
            board.close()
        mesh, self._mesh = self._mesh, None
        lifecycle.unregister(self)
        if mesh is None:
            return
        if hasattr(self, "trainer"):
            try:  # normally done right after start; this covers a start that failed half-way
                wait(self.trainer.unlink_shared_memory.call_one())
            except Exception:
                pass
        errors = mesh.stop()
        if errors:
            raise SessionError("forge_nb: some procs did not stop cleanly: " + "; ".join(errors))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _require_up(self) -> None:
        if self._mesh is None:
            raise SessionError("forge_nb: the session is down; start one with forge_nb.up()")

    # -- the loop ------------------------------------------------------------------------------

    def sampling(self, n: int | None = None, temperature: float | None = None) -> SamplingParams:
        e = self.config.engine
        return SamplingParams(
            n=n or self.config.algorithm.group_size,
            temperature=e.temperature if temperature is None else temperature,
            top_p=e.top_p, max_tokens=e.max_tokens,
            seed=self.config.seed * 1_000_003 + self.step_count,
        )  # fmt: skip

    def rollout(self, problems: list[Problem] | None = None) -> Rollout:
        """Generate G samples for each of P prompts, score them, compute group-relative advantages."""
        with self.generation_lock:
            return self._rollout(problems)

    def _rollout(self, problems: list[Problem] | None) -> Rollout:
        self._require_up()
        problems = problems or self.task.sample(self.config.algorithm.prompts_per_step)
        sampling = self.sampling()
        completions, policy_version, generate_s = self._generate([p.prompt for p in problems], sampling)
        episodes = self._episodes(problems, completions, policy_version)
        reference = self._reference_logprobs(episodes)  # runs while the reward procs score
        start = time.perf_counter()
        self._score(episodes)
        score_s = time.perf_counter() - start
        reference_s = self._attach_reference(episodes, reference)
        valid = torch.tensor([e.reward_error is None for e in episodes]).view(len(problems), sampling.n)
        if self.config.algorithm.overlong_cache:
            self._add_overlong_penalty([e for e in episodes if e.reward_error is None])
        rewards = torch.tensor([e.reward for e in episodes]).view(len(problems), sampling.n)
        advantages = group_relative(rewards, self.config.algorithm.normalize_std, valid=valid).flatten().tolist()
        for e, a in zip(episodes, advantages):
            e.advantage = a
        accuracy = sum(self.task.verify(e.completion, e.target) for e in episodes) / len(episodes)
        self.buffer.add(episodes)
        rollout = Rollout(episodes, policy_version, accuracy, generate_s, score_s, reference_s)
        self.metrics_stream.emit("rollout", step=self.step_count, **rollout.summary())
        return rollout

    def _generate(self, prompts: list[str], sampling: SamplingParams) -> tuple[list, int, float]:
        """Split the prompts over the generator replicas -> (completions in prompt order, policy
        version, seconds of the slowest replica). Replicas always serve the same version."""
        shards = _shards(len(prompts), self.config.mesh.generator_procs)
        futures = [
            self.generator.slice(procs=i).generate.call_one(prompts[shard], self._replica_sampling(sampling, i))
            for i, shard in enumerate(shards)
        ]
        results = [wait(f) for f in futures]
        versions = {version for _, version, _ in results}
        if len(versions) != 1:
            raise SessionError(f"forge_nb: generator replicas serve different policy versions {sorted(versions)}")
        completions = [group for groups, _, _ in results for group in groups]
        return completions, versions.pop(), max(seconds for _, _, seconds in results)

    @staticmethod
    def _replica_sampling(sampling: SamplingParams, replica: int) -> SamplingParams:
        if sampling.seed is None or replica == 0:
            return sampling
        return dataclasses.replace(sampling, seed=sampling.seed + 7919 * replica)

    def _score(self, episodes: list[Episode]) -> None:
        """Split the batch evenly over the reward procs; fill in each episode's reward (or error)."""
        batch = reward_batch(episodes, self.step_count)
        shards = _shards(len(batch), self.config.mesh.reward_procs)
        futures = [self.rewards.slice(procs=i).score.call_one(batch.shard(shard)) for i, shard in enumerate(shards)]
        for shard, future in zip(shards, futures):
            scores = wait(future)
            for i, e in enumerate(episodes[shard]):
                e.reward_version = scores.reward_version
                if i in scores.errors:
                    e.reward, e.reward_error = float("nan"), scores.errors[i]
                    self.reward_errors.append({"sample_id": e.sample_id, "reward_version": scores.reward_version,
                                               "prompt": e.prompt, "completion": e.completion,
                                               "error": scores.errors[i]})  # fmt: skip
                else:
                    e.reward = scores.rewards[i]

    def _reference_logprobs(self, episodes: list[Episode]) -> Future | None:
        """Ask the reference model for the episodes' logprobs (None when no reference runs)."""
        if self.reference is None:
            return None
        return self.reference.logprobs.call_one([e.prompt_ids for e in episodes], [e.completion_ids for e in episodes])

    @staticmethod
    def _attach_reference(episodes: list[Episode], reference: Future | None) -> float:
        """Wait for `_reference_logprobs` and store them on the episodes -> seconds waited."""
        if reference is None:
            return 0.0
        start = time.perf_counter()
        for e, logprobs in zip(episodes, wait(reference)):
            e.ref_logprobs = logprobs
        return time.perf_counter() - start

    def _episodes(self, problems, completions, policy_version, probe: bool = False) -> list[Episode]:
        """Episodes in prompt-major order; probe episodes get sample_id -1 and use no ids."""
        episodes = []
        for problem, group in zip(problems, completions):
            group_id = -1 if probe else self._next_sample_id
            for c in group:
                episodes.append(Episode(
                    sample_id=-1 if probe else self._next_sample_id, group_id=group_id,
                    prompt_id=problem.prompt_id, prompt=problem.prompt, completion=c.text, target=problem.target,
                    prompt_ids=c.prompt_ids, completion_ids=c.token_ids, logprobs=c.logprobs,
                    finish_reason=c.finish_reason, policy_version=policy_version,
                ))  # fmt: skip
                self._next_sample_id += 0 if probe else 1
        return episodes

    def probe_samples(self, n: int) -> list[Episode]:
        """`n` fresh samples of held-out prompts, scored by the task verifier, for validating live
        code before any rollout exists. Never stored and never trained on."""
        self._require_up()
        group = 4
        problems = self.task.eval_set()[: -(-n // group)]
        completions, version, _ = self._generate([p.prompt for p in problems], self.sampling(n=group))
        episodes = self._episodes(problems, completions, version, probe=True)
        rewards = torch.tensor([self.task.verify(e.completion, e.target) for e in episodes])
        advantages = group_relative(rewards.view(len(problems), group)).flatten().tolist()
        for e, r, a in zip(episodes, rewards.tolist(), advantages):
            e.reward, e.advantage = r, a
        return episodes[:n]

    def train(self, rollout: Rollout) -> dict[str, float]:
        """One optimizer step on `rollout` -> metrics (loss, grad_norm, policy_version, train_s, ...)."""
        with self.training_lock:
            return self._train(rollout)

    def _add_overlong_penalty(self, episodes: list[Episode]) -> None:
        """DAPO soft overlong punishment added to each reward (raw parts kept in `rewards`)."""
        lengths = torch.tensor([e.num_tokens for e in episodes])
        penalty = overlong_penalty(lengths, self.config.engine.max_tokens, self.config.algorithm.overlong_cache)
        for e, p in zip(episodes, penalty.tolist()):
            e.rewards = {"reward": e.reward, "overlong": p}
            e.reward += p

    def _train_batch(self, rollout: Rollout) -> list[Episode]:
        """The episodes to train on: those that scored, minus all-equal groups under dynamic sampling."""
        eps = [e for e in rollout.episodes if e.reward_error is None]
        if not eps:
            raise SessionError("forge_nb: every sample of this rollout failed its reward; nothing to train on")
        if not self.config.algorithm.dynamic_sampling:
            return eps
        groups: dict[int, set[float]] = {}
        for e in eps:
            groups.setdefault(e.group_id, set()).add(e.reward)
        return [e for e in eps if len(groups[e.group_id]) > 1]

    def _train(self, rollout: Rollout) -> dict[str, float]:
        self._require_up()
        eps = self._train_batch(rollout)
        if not eps:  # dynamic sampling left nothing: no step, nothing published
            metrics = {
                "loss": 0.0,
                "grad_norm": 0.0,
                "tokens": 0,
                "policy_version": self._trainer_version,
                "loss_version": self.registry.live("loss").version,
                "train_seconds": 0.0,
                "skipped": True,
            }
            self.metrics_stream.emit("train", step=self.step_count, **metrics)
            return metrics
        ref = None
        if self.reference is not None:
            # Rollouts carry them already; a rollout made before the reference existed does not.
            missing = [e for e in eps if e.ref_logprobs is None]
            self._attach_reference(missing, self._reference_logprobs(missing) if missing else None)
            ref = [e.ref_logprobs for e in eps]
        metrics = wait(self.trainer.train_step.call_one(
            [e.prompt_ids for e in eps], [e.completion_ids for e in eps], [e.logprobs for e in eps],
            [e.advantage for e in eps], ref,
        ))  # fmt: skip
        self._trainer_version = metrics["policy_version"]
        for e in eps:
            e.loss_version = metrics["loss_version"]
        self.metrics_stream.emit("train", step=self.step_count, **metrics)
        return metrics

    def sync(self) -> dict[str, Any]:
        """Refresh the generator with the trainer's latest published weights over RDMA -> report.

        The trainer publishes at the end of every `train`; this pulls that version. Report keys:
        version, previous_version, bytes, seconds, transfer_seconds, total_seconds, gbps, skipped.
        """
        with self.generation_lock:
            return self._sync()

    def _sync(self) -> dict[str, Any]:
        self._require_up()
        start = time.perf_counter()
        reports = list(wait(self.generator.refresh.call(self._trainer_version)).values())
        report = _combine_refresh_reports(reports)
        self._generator_version = report["version"]
        report = {**report, "total_seconds": time.perf_counter() - start}
        self.metrics_stream.emit("sync", step=self.step_count, **report)
        return report

    def step(self, n: int = 1, progress: bool = True) -> pd.DataFrame:
        """n x (rollout, train, sync) -> one row per step (reward, accuracy, tokens/s, phase times, GB/s).
        A progress bar shows from 5 steps on, unless `progress=False`."""
        rows = []
        for _ in tqdm(range(n), desc="forge_nb step", disable=n < 5 or not progress, leave=False):
            with self.generation_lock, self.training_lock:
                rows.append(self._step())
        return pd.DataFrame(rows).set_index("step")

    def _step(self) -> dict[str, Any]:
        start = time.perf_counter()
        rollout = self.rollout()
        staleness = self._trainer_version - rollout.policy_version
        train = self.train(rollout)
        refresh = self.sync()
        self.step_count += 1
        row = {
            "step": self.step_count, "policy_version": refresh["version"],
            "mean_reward": rollout.mean_reward, "accuracy": rollout.accuracy,
            "tokens_per_s": rollout.tokens_per_s, "generate_s": rollout.generate_s,
            "score_s": rollout.score_s, "reference_s": rollout.reference_s, "train_s": train["train_seconds"],
            "refresh_s": refresh["total_seconds"], "refresh_gbps": refresh["gbps"],
            "loss": train["loss"], "grad_norm": train["grad_norm"], "staleness": staleness,
            "step_s": time.perf_counter() - start,
        }  # fmt: skip
        self.metrics_stream.emit("step", **row)
        return row

    # -- background run ------------------------------------------------------------------------

    @property
    def background(self) -> BackgroundRun | AsyncRun | None:
        """The latest background run (its `state`, `done` steps and `error`), if any."""
        return self._run

    def run(self, steps: int | None = None, mode: str = "sync", max_staleness: int = 1) -> BackgroundRun | AsyncRun:
        """Train in the background (`steps` trainer steps, or until `stop()`); the kernel stays
        responsive and swaps, syncs and other calls from cells apply between batches.

        mode="sync": step after step (rollout, train, sync). mode="async": generation and training
        overlap; batches more than `max_staleness` policy versions old are dropped (see AsyncRun).
        """
        self._require_up()
        if self._run is not None and self._run.state in ("running", "paused"):
            raise SessionError(f"forge_nb: a background run is already {self._run.state}; stop() it first")
        if mode == "async":
            self._run = AsyncRun(self, steps, max_staleness).start()
        elif mode == "sync":
            self._run = BackgroundRun(lambda: self.step(1, progress=False), steps).start()
        else:
            raise SessionError(f"forge_nb: run mode must be 'sync' or 'async', got {mode!r}")
        return self._run

    def staleness(self) -> pd.Series:
        """Histogram of trained batches by staleness (trainer version - generating version)."""
        steps = self.metrics_stream.to_pandas("step")
        return steps.staleness.value_counts().sort_index() if not steps.empty else pd.Series(dtype=int)

    def pause(self) -> None:
        """Pause the background run after the step in flight."""
        if self._run is not None:
            self._run.pause()

    def resume(self) -> None:
        if self._run is not None:
            self._run.resume()

    def stop(self) -> None:
        """Stop the background run after the step in flight (the mesh stays up)."""
        if self._run is not None:
            self._run.stop()

    def evaluate(self, max_tokens: int | None = None) -> dict[str, float]:
        """Greedy accuracy on the task's held-out set under the generator's current weights."""
        self._require_up()
        problems = self.task.eval_set()
        sampling = SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens or self.config.engine.max_tokens)
        completions, version, seconds = self._generate([p.prompt for p in problems], sampling)
        correct = [self.task.verify(c[0].text, p.target) for c, p in zip(completions, problems)]
        result = {"policy_version": version, "heldout_accuracy": sum(correct) / len(correct), "eval_s": seconds}
        self.metrics_stream.emit("eval", step=self.step_count, **result)
        return result

    # -- inspection ----------------------------------------------------------------------------

    @property
    def trainer_version(self) -> int:
        """Policy version of the trainer's weights (the latest published)."""
        return self._trainer_version

    @property
    def generator_version(self) -> int:
        """Policy version the generator serves (as of the last sync)."""
        return self._generator_version

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
        self._require_up()
        with self.training_lock:
            version = wait(self.trainer.save.call_one(str(path)))
        self.tokenizer.save_pretrained(str(path))
        return version

    def export(self, path: str | Path, steps: int = 100) -> Path:
        """Write a standalone script + sbatch file that reproduce this session (config, current
        weights, live reward and loss) without a notebook -> the directory. See `forge_nb.export`."""
        from forge_nb.export import export_session

        self._require_up()
        return export_session(self, path, steps)

    def checksums(self) -> dict[str, tuple[int, str]]:
        """(version, weights checksum) of the trainer and of the generator. With the torch engine the
        generator's equals the trainer's after a sync. vLLM serves its own fused, repacked layout: its
        checksum is equal across replicas and changes with every refresh, but is not the trainer's
        (`tests/engines/test_vllm_engine.py` proves a refresh by matching logprobs instead)."""
        self._require_up()
        return {
            "trainer": wait(self.trainer.checksum.call_one()),
            "generator": wait(self.generator.slice(procs=0).checksum.call_one()),
            "generator_replicas": list(wait(self.generator.checksum.call()).values()),
        }

    def status(self) -> dict[str, Any]:
        """Mesh, actors and versions, as a dict (printable in a notebook)."""
        if self._mesh is None:
            return {"up": False, "steps": self.step_count}
        return {
            "up": True,
            "mesh": self.config.mesh.kind,
            "slurm_job": getattr(self._mesh, "job_id", None),
            "procs": self.pids,
            "steps": self.step_count,
            "policy_version": {"trainer": self.trainer_version, "generator": self.generator_version},
            "samples": self.buffer.added,
            "weights_transport": getattr(self, "weights_transport", None),
            "engine": self.engine_name,
            "reward_version": self.registry.live("reward").version,
            "loss_version": self.registry.live("loss").version,
            "run": None
            if self._run is None
            else {"state": self._run.state, "steps_done": self._run.done, "error": self._run.error},  # fmt: skip
            "reward_errors": len(self.reward_errors),
            "last_reward_errors": self.reward_errors[-3:],
            "model": str(self.config.model.resolved_path()),
        }

    # -- live code -----------------------------------------------------------------------------

    def set_reward(self, fn: Callable | str | LiveCode | None = None, *, version: int | None = None) -> int:
        """Validate `fn` (a function, a cell's source, or captured code) on recent samples, give it the
        next reward version and make it live in every reward actor from the next batch -> version.
        `version=N` makes an earlier version live again (rollback). Bad code raises `LiveCodeError`
        and the live version stays."""
        self._require_up()
        return swap.set_live(self, "reward", fn, version)

    def set_loss(self, fn: Callable | str | LiveCode | None = None, *, version: int | None = None) -> int:
        """As `set_reward`, for the loss the trainer minimises (validated forward and backward)."""
        self._require_up()
        return swap.set_live(self, "loss", fn, version)

    def versions(self, kind: str | None = None) -> pd.DataFrame:
        """Every reward / loss version (and rejected candidate): source, time, validation, status."""
        return self.registry.to_pandas(kind)

    def rescore(self, reward: Callable | str | int, n: int = 256) -> pd.DataFrame:
        """Score the last `n` samples with another reward (a function, source or version number),
        without touching the live one -> DataFrame of old and new rewards side by side."""
        return swap.rescore(self, reward, n)


def _shards(items: int, procs: int) -> list[slice]:
    """Contiguous, nearly equal slices of `items` for up to `procs` procs (none empty)."""
    chunk = -(-items // procs)
    return [slice(i * chunk, (i + 1) * chunk) for i in range(procs) if i * chunk < items]


def _combine_refresh_reports(reports: list[dict]) -> dict:
    """Replicas refresh in parallel: bytes add up, time is the slowest one's."""
    versions = {r["version"] for r in reports}
    if len(versions) != 1:
        raise SessionError(f"forge_nb: generator replicas refreshed to different versions {sorted(versions)}")
    if len(reports) == 1:
        return reports[0]
    seconds = max(r["seconds"] for r in reports)
    total = sum(r["bytes"] for r in reports)
    return {
        **reports[0], "bytes": total, "seconds": seconds, "replicas": len(reports),
        "transfer_seconds": max(r["transfer_seconds"] for r in reports),
        "gbps": total / seconds / 1e9 if seconds > 0 else 0.0,
        "skipped": all(r["skipped"] for r in reports),
    }  # fmt: skip
