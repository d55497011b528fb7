"""Hot-swap: capture, validate in the kernel, version, then ship source to the actors.

Rejected code never leaves the kernel and gets no version number; the live version stays live.
Actors swap between batches: an endpoint call never runs concurrently with a `score` or
`train_step` on the same actor, so no batch mixes versions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pandas as pd

from forge_nb.live.capture import LiveCode, LiveCodeError, compile_function, from_function, from_source
from forge_nb.live.probe import loss_probe, reward_probes
from forge_nb.live.validate import (
    CheckFailed,
    run_with_timeout,
    score_each,
    validate_loss,
    validate_reward,
)
from forge_nb.mesh.calls import wait
from forge_nb.rl.episode import Episode
from forge_nb.rl.train_step import needs_ref

if TYPE_CHECKING:
    from forge_nb.session import Session

KINDS = ("reward", "loss")


def capture(kind: str, fn: Callable | str | LiveCode) -> LiveCode:
    """A function, a cell's source or already captured code -> `LiveCode`."""
    if isinstance(fn, LiveCode):
        return fn
    if isinstance(fn, str):
        return from_source(kind, fn)
    if callable(fn):
        return from_function(kind, fn)
    raise LiveCodeError(f"set_{kind} takes a function, a cell's source or version=N; got {type(fn).__name__}")


def set_live(session: Session, kind: str, fn: Callable | str | LiveCode | None, version: int | None) -> int:
    """Make new code (validated) or an earlier version live in the actors -> the live version."""
    registry, previous = session.registry, session.registry.live(kind)
    if version is not None:
        if fn is not None:
            raise LiveCodeError(f"set_{kind}: give a function or version=N, not both")
        try:
            record = registry.get(kind, version)
        except KeyError as e:
            raise LiveCodeError(f"set_{kind}: {e.args[0]} -- v{previous.version} stays live") from None
        ship(session, kind, record.code, version)
        registry.make_live(kind, version)
        return version
    candidate = registry.next_version(kind)
    code = None
    try:
        code = capture(kind, fn)
        validation = validate(session, kind, code)
    except (LiveCodeError, CheckFailed) as e:
        if code is None:  # could not even be parsed: keep the text for the record
            code = LiveCode(kind, "", fn if isinstance(fn, str) else repr(fn), "cell")
        registry.reject(kind, code, {"error": str(e)})
        origin = code.origin
        raise LiveCodeError(f"{kind} v{candidate} ({origin}): {e} -- v{previous.version} stays live") from None
    record = registry.accept(kind, code, validation)
    try:
        ship(session, kind, code, record.version)
    except Exception as e:
        # An actor could not compile what the kernel could: put the previous version back everywhere.
        record.status, record.validation["error"] = "rejected", f"actor compile failed: {e}"
        registry.make_live(kind, previous.version)
        ship(session, kind, previous.code, previous.version)
        message = f"{kind} v{record.version}: an actor failed to load it ({e}); v{previous.version} stays live"
        raise LiveCodeError(message) from None
    return record.version


def validate(session: Session, kind: str, code: LiveCode) -> dict:
    """Compile and run `code` on a probe batch of real samples -> validation record (raises CheckFailed)."""
    timeout = session.config.live.timeout_s
    start = time.perf_counter()
    fn = run_with_timeout(lambda: compile_function(code), timeout)
    episodes = probe_episodes(session)
    if kind == "reward":
        validate_reward(fn, reward_probes(episodes, session.step_count), timeout)
    else:
        if needs_ref(fn) and session.reference is None:
            raise CheckFailed("the loss takes ref_logprobs, but no reference model runs: start the session with "
                              "algorithm.kl_coef > 0 (e.g. forge_nb.up(kl_coef=0.04))")  # fmt: skip
        validate_loss(fn, loss_probe(episodes), timeout)
    return {"seconds": time.perf_counter() - start, "probe_size": len(episodes), "error": None}


def ship(session: Session, kind: str, code: LiveCode, version: int) -> None:
    """Send source + version to every actor of `kind`; returns once each has compiled it.

    Under the lock of the side it changes, so a background run sees the swap between two batches.
    """
    with session.generation_lock if kind == "reward" else session.training_lock:
        if kind == "reward":
            wait(session.rewards.set_reward.call(code, version))
        else:
            wait(session.trainer.set_loss.call_one(code, version))


def probe_episodes(session: Session) -> list[Episode]:
    """The most recent successfully scored samples; before the first rollout, fresh samples of
    held-out prompts (generated for the probe only: never stored, never trained on)."""
    n = session.config.live.probe_size
    recent = [e for e in session.buffer.recent(4 * n) if e.reward_error is None][-n:]
    return recent or session.probe_samples(n)


def rescore(session: Session, reward: Callable | str | int, n: int) -> pd.DataFrame:
    """Old and new rewards of the last `n` samples; the live reward is not touched."""
    timeout = session.config.live.timeout_s
    if isinstance(reward, int) and not isinstance(reward, bool):
        code, label = session.registry.get("reward", reward).code, f"v{reward}"
        fn = run_with_timeout(lambda: compile_function(code), timeout)
    elif isinstance(reward, str):
        code, label = from_source("reward", reward), "candidate"
        fn = run_with_timeout(lambda: compile_function(code), timeout)
    else:  # a function runs here in the kernel as it is: a what-if never leaves the kernel
        fn, label = reward, getattr(reward, "__name__", "candidate")
    episodes = session.buffer.recent(n)
    probes = reward_probes(episodes, session.step_count)
    new, errors = [math.nan] * len(probes), {}
    run_with_timeout(lambda: score_each(fn, probes, new, errors), timeout * max(1, len(probes)))
    df = pd.DataFrame([e.row() for e in episodes])[
        ["sample_id", "prompt", "completion", "target", "policy_version", "reward_version", "reward"]
    ]
    df["new_reward"], df["new_error"] = new, [errors.get(i) for i in range(len(probes))]
    df["delta"] = df["new_reward"] - df["reward"]
    df.attrs["new_reward"] = label
    return df
