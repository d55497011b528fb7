"""One owner of live code: every reward and loss version, validated in the kernel, shipped to the actors.

Rejected code never leaves the kernel and gets no version number; the live version stays live.
Actors swap between batches: the host ships under the lock of the side it changes, and an endpoint
call never runs concurrently with a `score` or `train_step` on the same actor, so no batch mixes
versions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

import pandas as pd

from forge_nb.config import Config
from forge_nb.live.builtin import builtin_loss, builtin_reward
from forge_nb.live.capture import LiveCode, LiveCodeError, compile_function, from_function, from_source
from forge_nb.live.probe import loss_probe
from forge_nb.live.registry import Registry, VersionRecord
from forge_nb.live.validate import CheckFailed, run_with_timeout, score_each, validate_loss, validate_reward
from forge_nb.rewards.batch import reward_batch
from forge_nb.rl.episode import Episode
from forge_nb.rl.train_step import needs_ref

KINDS = ("reward", "loss")


class LiveHost(Protocol):
    """What the manager needs from the session it serves."""

    step_count: int

    @property
    def has_reference(self) -> bool: ...

    def recent_samples(self, n: int) -> list[Episode]:
        """The newest `n` samples (or fewer)."""
        ...

    def probe_samples(self, n: int) -> list[Episode]:
        """`n` fresh samples of held-out prompts, scored by the task's verifier (never trained on)."""
        ...

    def ship(self, kind: str, code: LiveCode, version: int) -> None:
        """Make `code` live as `version` in every actor of `kind`; returns once each has compiled it."""
        ...


def capture(kind: str, fn: Callable | str | LiveCode) -> LiveCode:
    """A function, a cell's source or already captured code -> `LiveCode`."""
    if isinstance(fn, LiveCode):
        return fn
    if isinstance(fn, str):
        return from_source(kind, fn)
    if callable(fn):
        return from_function(kind, fn)
    raise LiveCodeError(f"set_{kind} takes a function, a cell's source or version=N; got {type(fn).__name__}")


class LiveCodeManager:
    """The registry of versions (v0 of each kind is the config's built-in), validation on a probe
    batch of real samples, shipping to the actors, rollback, and what-if rescoring."""

    def __init__(self, config: Config, host: LiveHost) -> None:
        self.host = host
        self.timeout_s, self.probe_size = config.live.timeout_s, config.live.probe_size
        self.registry = Registry()
        self.registry.add_builtin("reward", builtin_reward(config.task, config.seed))
        self.registry.add_builtin("loss", builtin_loss(config.algorithm))

    def live(self, kind: str) -> VersionRecord:
        return self.registry.live(kind)

    def set(self, kind: str, fn: Callable | str | LiveCode | None, version: int | None = None) -> int:
        """Make new code (validated) or an earlier `version` live in the actors -> the live version."""
        if version is not None:
            return self._roll_to(kind, fn, version)
        registry, previous = self.registry, self.registry.live(kind)
        candidate = registry.next_version(kind)
        code = None
        try:
            code = capture(kind, fn)
            validation = self.validate(kind, code)
        except (LiveCodeError, CheckFailed) as e:
            if code is None:  # could not even be parsed: keep the text for the record
                code = LiveCode(kind, "", fn if isinstance(fn, str) else repr(fn), "cell")
            registry.reject(kind, code, {"error": str(e)})
            raise LiveCodeError(f"{kind} v{candidate} ({code.origin}): {e} -- v{previous.version} stays live") from None
        record = registry.accept(kind, code, validation)
        try:
            self.host.ship(kind, code, record.version)
        except Exception as e:
            # An actor could not compile what the kernel could: put the previous version back everywhere.
            record.status, record.validation["error"] = "rejected", f"actor compile failed: {e}"
            registry.make_live(kind, previous.version)
            self.host.ship(kind, previous.code, previous.version)
            message = f"{kind} v{record.version}: an actor failed to load it ({e}); v{previous.version} stays live"
            raise LiveCodeError(message) from None
        return record.version

    def _roll_to(self, kind: str, fn: object, version: int) -> int:
        """Rollback (or roll forward) to a version the registry holds."""
        if fn is not None:
            raise LiveCodeError(f"set_{kind}: give a function or version=N, not both")
        try:
            record = self.registry.get(kind, version)
        except KeyError as e:
            live = self.registry.live(kind).version
            raise LiveCodeError(f"set_{kind}: {e.args[0]} -- v{live} stays live") from None
        self.host.ship(kind, record.code, version)
        self.registry.make_live(kind, version)
        return version

    def validate(self, kind: str, code: LiveCode) -> dict:
        """Compile and run `code` on a probe batch of real samples -> validation record (raises CheckFailed)."""
        start = time.perf_counter()
        fn = run_with_timeout(lambda: compile_function(code), self.timeout_s)
        episodes = self.probe_episodes()
        if kind == "reward":
            validate_reward(fn, list(reward_batch(episodes, self.host.step_count).samples()), self.timeout_s)
        else:
            if needs_ref(fn) and not self.host.has_reference:
                raise CheckFailed(
                    "the loss takes ref_logprobs, but no reference model runs: start the session with "
                    "algorithm.kl_coef > 0 (e.g. forge_nb.up(kl_coef=0.04))"
                )
            validate_loss(fn, loss_probe(episodes), self.timeout_s)
        return {"seconds": time.perf_counter() - start, "probe_size": len(episodes), "error": None}

    def probe_episodes(self) -> list[Episode]:
        """The most recent successfully scored samples; before the first rollout, fresh samples of
        held-out prompts (generated for the probe only: never stored, never trained on)."""
        n = self.probe_size
        recent = [e for e in self.host.recent_samples(4 * n) if e.reward_error is None][-n:]
        return recent or self.host.probe_samples(n)

    def rescore(self, reward: Callable | str | int, n: int) -> pd.DataFrame:
        """Old and new rewards of the last `n` samples; the live reward is not touched."""
        if isinstance(reward, int) and not isinstance(reward, bool):
            code, label = self.registry.get("reward", reward).code, f"v{reward}"
            fn = run_with_timeout(lambda: compile_function(code), self.timeout_s)
        elif isinstance(reward, str):
            code, label = from_source("reward", reward), "candidate"
            fn = run_with_timeout(lambda: compile_function(code), self.timeout_s)
        else:  # a function runs here in the kernel as it is: a what-if never leaves the kernel
            fn, label = reward, getattr(reward, "__name__", "candidate")
        episodes = self.host.recent_samples(n)
        samples = list(reward_batch(episodes, self.host.step_count).samples())
        new, errors = [math.nan] * len(samples), {}
        run_with_timeout(lambda: score_each(fn, samples, new, errors), self.timeout_s * max(1, len(samples)))
        columns = ["sample_id", "prompt", "completion", "target", "policy_version", "reward_version", "reward"]
        df = pd.DataFrame([e.row() for e in episodes])[columns]
        df["new_reward"], df["new_error"] = new, [errors.get(i) for i in range(len(samples))]
        df["delta"] = df["new_reward"] - df["reward"]
        df.attrs["new_reward"] = label
        return df

    def versions(self, kind: str | None = None) -> pd.DataFrame:
        return self.registry.to_pandas(kind)
