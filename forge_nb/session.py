"""Session: the kernel-held controller of one RL post-training run on a Monarch mesh.

It reads like the training loop it drives::

    s = Session.up()            # generator, trainer and reward actors in their own procs
    r = s.rollout()             # generate P x G samples, score them, group-relative advantages
    m = s.train(r)              # one GRPO step on the trainer; policy version v -> v + 1
    w = s.sync()                # trainer publishes v + 1, generator pulls it over RDMA
    s.down()                    # every proc stopped
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd
import torch
from transformers import AutoTokenizer

from forge_nb.actors.generator import Generator
from forge_nb.actors.reward import RewardWorker
from forge_nb.actors.trainer import Trainer
from forge_nb.config import Config
from forge_nb.engines.base import SamplingParams
from forge_nb.mesh import lifecycle
from forge_nb.mesh.local import LocalMesh
from forge_nb.metrics import MetricsStream
from forge_nb.rl.advantages import group_relative
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
        self._mesh: LocalMesh | None = None
        self._trainer_version = 0

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
        self._mesh = mesh = LocalMesh()
        threads = cfg.mesh.threads_per_proc
        try:
            self.generator = mesh.spawn("generator", Generator, model_dir, cfg.model.dtype, threads)
            self.trainer = mesh.spawn("trainer", Trainer, model_dir, cfg.model.dtype, threads, cfg.algorithm,
                                      self.tokenizer.pad_token_id, cfg.engine.temperature)  # fmt: skip
            self.rewards = mesh.spawn("reward", RewardWorker, cfg.task, cfg.seed, procs=cfg.mesh.reward_procs)
            # Registered after the spawns, so our exit hook runs before the ones Monarch adds there.
            lifecycle.register(self)
            self.pids = self._wait_ready()
            self.generator.attach.call_one(self.trainer.weights_manifest.call_one().get()).get()
        except Exception as e:
            self.down()
            raise SessionError(f"forge_nb: the mesh failed to start ({type(e).__name__}): {e}") from e

    def _wait_ready(self) -> dict[str, list[int]]:
        """Ask every actor for its pid: returns once each constructor has finished (or raises its error)."""
        return {
            "generator": [self.generator.pid.call_one().get()],
            "trainer": [self.trainer.pid.call_one().get()],
            "reward": [pid for _, pid in self.rewards.pid.call().get().items()],
        }

    @property
    def is_up(self) -> bool:
        return self._mesh is not None

    def down(self) -> None:
        """Stop every proc this session started. Safe to call twice."""
        mesh, self._mesh = self._mesh, None
        lifecycle.unregister(self)
        if mesh is not None:
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
        self._require_up()
        problems = problems or self.task.sample(self.config.algorithm.prompts_per_step)
        sampling = self.sampling()
        completions, policy_version, generate_s = self.generator.generate.call_one(
            [p.prompt for p in problems], sampling
        ).get()
        texts = [c.text for group in completions for c in group]
        targets = [p.target for p in problems for _ in range(sampling.n)]
        start = time.perf_counter()
        rewards, reward_version = self._score(texts, targets)
        score_s = time.perf_counter() - start
        advantages = group_relative(
            torch.tensor(rewards).view(len(problems), sampling.n), self.config.algorithm.normalize_std
        ).flatten()
        episodes = self._episodes(problems, completions, rewards, advantages.tolist(), policy_version, reward_version)
        accuracy = sum(self.task.verify(t, g) for t, g in zip(texts, targets)) / len(texts)
        self.buffer.add(episodes)
        rollout = Rollout(episodes, policy_version, accuracy, generate_s, score_s)
        self.metrics_stream.emit("rollout", step=self.step_count, **rollout.summary())
        return rollout

    def _score(self, texts: list[str], targets: list[str]) -> tuple[list[float], int]:
        """Split the batch evenly over the reward procs and gather the scores in order."""
        workers = self.config.mesh.reward_procs
        chunk = -(-len(texts) // workers)
        futures = [
            self.rewards.slice(procs=i).score.call_one(
                texts[i * chunk : (i + 1) * chunk], targets[i * chunk : (i + 1) * chunk]
            )
            for i in range(workers)
            if i * chunk < len(texts)
        ]
        results = [f.get() for f in futures]
        return [r for rewards, _ in results for r in rewards], results[0][1]

    def _episodes(self, problems, completions, rewards, advantages, policy_version, reward_version) -> list[Episode]:
        episodes = []
        for problem, group in zip(problems, completions):
            group_id = self._next_sample_id
            for c in group:
                k = len(episodes)
                episodes.append(Episode(
                    sample_id=self._next_sample_id, group_id=group_id, prompt_id=problem.prompt_id,
                    prompt=problem.prompt, completion=c.text, target=problem.target, prompt_ids=c.prompt_ids,
                    completion_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason,
                    policy_version=policy_version, reward=rewards[k], advantage=advantages[k],
                    reward_version=reward_version,
                ))  # fmt: skip
                self._next_sample_id += 1
        return episodes

    def train(self, rollout: Rollout) -> dict[str, float]:
        """One optimizer step on `rollout` -> metrics (loss, grad_norm, policy_version, train_s, ...)."""
        self._require_up()
        eps = rollout.episodes
        metrics = self.trainer.train_step.call_one(
            [e.prompt_ids for e in eps], [e.completion_ids for e in eps],
            [e.logprobs for e in eps], [e.advantage for e in eps],
        ).get()  # fmt: skip
        self._trainer_version = metrics["policy_version"]
        self.metrics_stream.emit("train", step=self.step_count, **metrics)
        return metrics

    def sync(self) -> dict[str, Any]:
        """Refresh the generator with the trainer's latest published weights over RDMA -> report.

        The trainer publishes at the end of every `train`; this pulls that version. Report keys:
        version, previous_version, bytes, seconds, transfer_seconds, total_seconds, gbps, skipped.
        """
        self._require_up()
        start = time.perf_counter()
        report = self.generator.refresh.call_one(self._trainer_version).get()
        report = {**report, "total_seconds": time.perf_counter() - start}
        self.metrics_stream.emit("sync", step=self.step_count, **report)
        return report

    def step(self, n: int = 1) -> pd.DataFrame:
        """n x (rollout, train, sync) -> one row per step (reward, accuracy, tokens/s, phase times, GB/s)."""
        rows = []
        for _ in range(n):
            start = time.perf_counter()
            rollout = self.rollout()
            train = self.train(rollout)
            refresh = self.sync()
            self.step_count += 1
            row = {
                "step": self.step_count, "policy_version": refresh["version"],
                "mean_reward": rollout.mean_reward, "accuracy": rollout.accuracy,
                "tokens_per_s": rollout.tokens_per_s, "generate_s": rollout.generate_s,
                "score_s": rollout.score_s, "train_s": train["train_seconds"],
                "refresh_s": refresh["total_seconds"], "refresh_gbps": refresh["gbps"],
                "loss": train["loss"], "grad_norm": train["grad_norm"], "step_s": time.perf_counter() - start,
            }  # fmt: skip
            self.metrics_stream.emit("step", **row)
            rows.append(row)
        return pd.DataFrame(rows).set_index("step")

    def evaluate(self, max_tokens: int | None = None) -> dict[str, float]:
        """Greedy accuracy on the task's held-out set under the generator's current weights."""
        self._require_up()
        problems = self.task.eval_set()
        sampling = SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens or self.config.engine.max_tokens)
        completions, version, seconds = self.generator.generate.call_one([p.prompt for p in problems], sampling).get()
        correct = [self.task.verify(c[0].text, p.target) for c, p in zip(completions, problems)]
        result = {"policy_version": version, "heldout_accuracy": sum(correct) / len(correct), "eval_s": seconds}
        self.metrics_stream.emit("eval", step=self.step_count, **result)
        return result

    # -- inspection ----------------------------------------------------------------------------

    @property
    def metrics(self) -> pd.DataFrame:
        """Every metrics row so far (all kinds) as a DataFrame."""
        return self.metrics_stream.to_pandas()

    def checksums(self) -> dict[str, tuple[int, str]]:
        """(version, weights checksum) of the trainer and of the generator."""
        self._require_up()
        return {
            "trainer": self.trainer.checksum.call_one().get(),
            "generator": self.generator.checksum.call_one().get(),
        }

    def status(self) -> dict[str, Any]:
        """Mesh, actors and versions, as a dict (printable in a notebook)."""
        if self._mesh is None:
            return {"up": False, "steps": self.step_count}
        return {
            "up": True,
            "mesh": self.config.mesh.kind,
            "procs": self.pids,
            "steps": self.step_count,
            "policy_version": {
                "trainer": self.trainer.checksum.call_one().get()[0],
                "generator": self.generator.checksum.call_one().get()[0],
            },  # fmt: skip
            "samples": self.buffer.added,
            "model": str(self.config.model.resolved_path()),
        }
