"""One owner of live code: every reward and loss version, validated on real samples, shipped to the actors.

Code is captured in the kernel (read, never run: `live.closure`, `live.capture`) and checked on a
probe batch in the checker's proc (`fleet.checker`), which is replaced when a check hangs, so no live
code ever runs in the kernel. Rejected code never reaches the reward or trainer actors and gets no
version number; the live version stays live.
Actors swap between batches: the host ships under the lock of the side it changes, and an endpoint
call never runs concurrently with a `score` or `train_step` on the same actor, so no batch mixes
versions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

import pandas as pd

from forge_nb.config import Config
from forge_nb.live.builtin import builtin_loss, builtin_reward
from forge_nb.live.capture import LiveCode, LiveCodeError, from_source
from forge_nb.live.closure import capture_callable
from forge_nb.live.probe import loss_probe
from forge_nb.live.registry import Member, Registry, VersionRecord
from forge_nb.live.validate import CheckFailed, LossProbe
from forge_nb.rewards.batch import RewardSample, Scores
from forge_nb.rl.episode import Episode
from forge_nb.rl.pipeline import reward_batch
from forge_nb.state import RunState

KINDS = ("reward", "loss")


class LiveTargets(Protocol):
    """The actors live code is checked in and goes to (`fleet.fleet.Fleet`). The setters return once
    every actor of the role has compiled the code; the checks raise `CheckFailed`, also after
    `timeout` s."""

    def set_rewards(self, members: dict[str, Member], version: int) -> None: ...

    def set_loss(self, code: LiveCode, version: int) -> None: ...

    def check_reward(self, code: LiveCode, samples: list[RewardSample], timeout: float) -> list[float]: ...

    def check_loss(self, code: LiveCode, probe: LossProbe, has_reference: bool, timeout: float) -> float: ...

    def rescore(self, members: dict[str, Member], samples: list[RewardSample], timeout: float) -> Scores: ...

    @property
    def has_reference(self) -> bool:
        """Whether a reference model runs (a loss that takes `ref_logprobs` needs one)."""
        ...


Probe = Callable[[int], list[Episode]]  # n -> n fresh samples of held-out prompts, never trained on


def capture(kind: str, fn: Callable | str | LiveCode) -> LiveCode:
    """A function or callable object, a cell's source or already captured code -> `LiveCode`."""
    if isinstance(fn, LiveCode):
        return fn
    if isinstance(fn, str):
        return from_source(kind, fn)
    return capture_callable(kind, fn)


class LiveCodeManager:
    """The registry of versions (v0 of each kind is the config's built-in), validation on a probe
    batch of real samples, shipping to the actors, rollback, and what-if rescoring.

    Rewards are named members with weights (`live.registry`); `set("reward", fn)` replaces the
    member called "reward", `name=` adds or replaces another one. The loss is the one member "loss".
    """

    def __init__(self, config: Config) -> None:
        self._targets: LiveTargets | None = None
        self._locks: dict[str, AbstractContextManager] = {}
        self._state: RunState | None = None
        self._probe: Probe | None = None
        self.timeout_s, self.probe_size = config.live.timeout_s, config.live.probe_size
        self.registry = Registry()
        self.registry.add_builtin("reward", "reward", builtin_reward(config.task))
        self.registry.add_builtin("loss", "loss", builtin_loss(config.algorithm, config.engine.max_tokens))

    def live(self, kind: str) -> VersionRecord:
        return self.registry.live(kind)

    def live_sets(self) -> dict[str, tuple[int, dict[str, Member]]]:
        """Each kind's live version and its members (what an export writes out)."""
        return {kind: (self.registry.live(kind).version, self.registry.members(kind)) for kind in KINDS}

    def connect(
        self,
        targets: LiveTargets,
        reward_lock: AbstractContextManager,
        loss_lock: AbstractContextManager,
        state: RunState,
        probe: Probe,
    ) -> None:
        """Check in and ship to `targets` from now on, each kind under the lock of the side it changes
        (so a background run sees a swap between two batches). Candidates are checked on the newest
        samples of `state`'s buffer; before the first rollout, on `probe(n)` samples."""
        self._targets, self._locks = targets, {"reward": reward_lock, "loss": loss_lock}
        self._state, self._probe = state, probe

    def ship(self, kind: str, members: dict[str, Member], version: int) -> None:
        """Make the set `members` live as `version` in every actor of `kind`."""
        targets = self._connected()
        with self._locks[kind]:
            if kind == "reward":
                targets.set_rewards(members, version)
            else:
                targets.set_loss(members["loss"].code, version)

    def set(
        self,
        kind: str,
        fn: Callable | str | LiveCode | None,
        version: int | None = None,
        *,
        name: str | None = None,
        weight: float | None = None,
    ) -> int:
        """Make new code (validated), a new weight, or an earlier `version` live in the actors -> the
        live version. `name` picks the reward member (default: "reward"); `weight` its weight."""
        if version is not None:
            return self._roll_to(kind, fn, version)
        name = self._member_name(kind, name, weight)
        if fn is None:
            return self._reweigh(kind, name, weight)
        registry, previous = self.registry, self.registry.live(kind)
        candidate = registry.next_version(kind)
        code = None
        try:
            code = capture(kind, fn)
            validation = self.validate(kind, code)
        except (LiveCodeError, CheckFailed) as e:
            if code is None:  # could not even be parsed: keep the text for the record
                code = LiveCode(kind, "", fn if isinstance(fn, str) else repr(fn), "cell")
            registry.reject(kind, name, code, {"error": str(e)}, candidate)
            label = kind if name == kind else f"{kind} {name!r}"
            raise LiveCodeError(
                f"{label} v{candidate} ({code.origin}): {e} -- v{previous.version} stays live"
            ) from None
        record = registry.accept(kind, name, registry.propose(kind, name, code, weight), validation)
        self._ship_or_restore(record, previous)
        return record.version

    def remove(self, kind: str, name: str) -> int:
        """Take reward member `name` out of the live set (a new version) -> the live version."""
        members = self.registry.members(kind)
        if name not in members:
            raise LiveCodeError(f"remove: no {kind} member {name!r}; live members: {sorted(members)}")
        if len(members) == 1:
            raise LiveCodeError(f"remove: {name!r} is the only {kind}; set another one first")
        previous = self.registry.live(kind)
        del members[name]
        record = self.registry.accept(kind, name, members, {"seconds": 0.0}, change="removed")
        self._ship_or_restore(record, previous)
        return record.version

    def _member_name(self, kind: str, name: str | None, weight: float | None) -> str:
        if kind == "loss" and (name not in (None, "loss") or weight is not None):
            raise LiveCodeError("set_loss: the loss is one function; name= and weight= are for rewards")
        if weight is not None and not (isinstance(weight, int | float) and math.isfinite(weight)):
            raise LiveCodeError(f"set_{kind}: weight must be a finite number, got {weight!r}")
        if name is not None and not (isinstance(name, str) and name.isidentifier()):
            raise LiveCodeError(f"set_{kind}: name must be a Python identifier (a column name), got {name!r}")
        return name or kind

    def _reweigh(self, kind: str, name: str, weight: float | None) -> int:
        if weight is None:
            raise LiveCodeError(f"set_{kind}: give a function, weight=W (with name=) or version=N")
        previous = self.registry.live(kind)
        try:
            members = self.registry.propose(kind, name, None, weight)
        except KeyError as e:
            raise LiveCodeError(f"set_{kind}: {e.args[0]}") from None
        record = self.registry.accept(kind, name, members, {"seconds": 0.0}, change="weight")
        self._ship_or_restore(record, previous)
        return record.version

    def _ship_or_restore(self, record: VersionRecord, previous: VersionRecord) -> None:
        """Ship `record`'s set; if an actor cannot load it, put `previous` back everywhere."""
        try:
            self.ship(record.kind, record.members, record.version)
        except Exception as e:
            record.status, record.validation["error"] = "rejected", f"actor compile failed: {e}"
            self.registry.make_live(record.kind, previous.version)
            self.ship(previous.kind, previous.members, previous.version)
            message = (
                f"{record.kind} v{record.version}: an actor failed to load it ({e}); v{previous.version} stays live"
            )
            raise LiveCodeError(message) from None

    def _roll_to(self, kind: str, fn: object, version: int) -> int:
        """Rollback (or roll forward) to a version the registry holds."""
        if fn is not None:
            raise LiveCodeError(f"set_{kind}: give a function or version=N, not both")
        try:
            record = self.registry.get(kind, version)
        except KeyError as e:
            live = self.registry.live(kind).version
            raise LiveCodeError(f"set_{kind}: {e.args[0]} -- v{live} stays live") from None
        self.ship(kind, record.members, version)
        self.registry.make_live(kind, version)
        return version

    def validate(self, kind: str, code: LiveCode) -> dict:
        """Run `code` on a probe batch of real samples in the checker -> validation record (raises CheckFailed)."""
        targets = self._connected()
        start = time.perf_counter()
        episodes = self.probe_episodes()
        if kind == "reward":
            samples = list(reward_batch(episodes, self._state.step_count).samples())
            targets.check_reward(code, samples, self.timeout_s)
        else:
            targets.check_loss(code, loss_probe(episodes), targets.has_reference, self.timeout_s)
        return {"seconds": time.perf_counter() - start, "probe_size": len(episodes), "error": None}

    def _connected(self) -> LiveTargets:
        if self._targets is None:
            raise LiveCodeError("live code: no actors to check it in or ship it to (the session is down)")
        return self._targets

    def probe_episodes(self) -> list[Episode]:
        """The most recent successfully scored samples; before the first rollout, fresh samples of
        held-out prompts (generated for the probe only: never stored, never trained on)."""
        n = self.probe_size
        recent = [e for e in self._state.buffer.recent(4 * n) if e.reward_error is None][-n:]
        return recent or self._probe(n)

    def rescore(self, reward: Callable | str | int, n: int) -> pd.DataFrame:
        """Old and new rewards of the last `n` samples; the live reward is not touched. `reward` is a
        function or a cell's source (run in the checker, like a candidate) or a reward version (its
        whole weighted set)."""
        if isinstance(reward, int) and not isinstance(reward, bool):
            members, label = self.registry.get("reward", reward).members, f"v{reward}"
        else:
            code = capture("reward", reward)
            members, label = {"candidate": Member(code)}, "candidate" if isinstance(reward, str) else code.name
        self._connected()
        episodes = self._state.buffer.recent(n)
        samples = list(reward_batch(episodes, self._state.step_count).samples())
        budget = self.timeout_s * max(1, len(samples)) * len(members)
        scores = self._connected().rescore(members, samples, budget)
        columns = ["sample_id", "prompt", "completion", "target", "policy_version", "reward_version", "reward"]
        df = pd.DataFrame([e.row() for e in episodes], columns=columns)
        df["new_reward"] = [math.nan if r is None else r for r in scores.rewards]
        df["new_error"] = [scores.errors.get(i) for i in range(len(samples))]
        df["delta"] = df["new_reward"] - df["reward"]
        df.attrs["new_reward"] = label
        return df

    def versions(self, kind: str | None = None) -> pd.DataFrame:
        return self.registry.to_pandas(kind)
