"""The live agent rollout: versions of it, each checked on probe rows before the env procs swap to it.

Version 0 is single-turn generation (no agent). `set_rollout(fn, tools=[...])` takes an agent loop
``async def rollout(client, row, **context)``; `set_env(cls)` an environment class with ``reset(row)``
/ ``step(action)``. Code travels as source (`live.closure`), its tools too, and is checked where it
will run: the env procs run it on a few probe rows with the generator serving the current policy,
without making it live. A candidate whose every probe trajectory failed (raised, returned the wrong
type) or none of which finished within the limits (`agent.*`) is refused, naming the version, the row,
the turn and the cause; the live version stays (an environment may end every probe at the limits, as a
game cut short does). Otherwise it gets the next version and the env procs
swap to it between batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from forge_nb.actors.env import AgentCode
from forge_nb.agents.trajectory import Trajectory
from forge_nb.live.capture import LiveCode, LiveCodeError
from forge_nb.live.closure import capture_callable
from forge_nb.live.registry import Member, Registry

KIND = "rollout"
SINGLE_TURN = LiveCode(KIND, "", "", "built-in: one completion per sample (no agent)")
PROBE_ROWS = 2


def install(registry: Registry) -> None:
    """Version 0 of the rollout: single-turn generation."""
    if not any(r.kind == KIND for r in registry.records):
        registry.add_builtin(KIND, KIND, SINGLE_TURN)


def agent_code(record_members: dict[str, Member]) -> AgentCode | None:
    """What the env procs run for a version's members (None: single-turn)."""
    code = record_members[KIND].code
    if not code.source:
        return None
    tools = tuple(m.code for name, m in record_members.items() if name.startswith("tool:"))
    return AgentCode(code, code.kind if code.kind == "env" else "rollout", tools)


class AgentRollouts:
    """Sets, checks and ships the live rollout (kind "rollout" in the session's registry)."""

    def __init__(self, registry: Callable[[], Registry]) -> None:
        self._registry = registry  # the session's registry (replaced when a checkpoint is loaded)
        self._envs: Any = None
        self._lock: AbstractContextManager | None = None
        self._probe: Callable[[AgentCode], list[Trajectory]] | None = None

    def connect(self, envs: Any, lock: AbstractContextManager, probe: Callable[[AgentCode], list[Trajectory]]) -> None:
        """Ship to `envs` (the env pool) under `lock` (the generator side's); check candidates with `probe`."""
        self._envs, self._lock, self._probe = envs, lock, probe

    def set(self, form: str, fn: Any, tools: Sequence[Callable] = (), version: int | None = None) -> int:
        """Make a new rollout (form "rollout": an agent loop; "env": an environment class) or an earlier
        `version` live -> the live version."""
        registry = self._registry()
        install(registry)
        if version is not None:
            if fn is not None:
                raise LiveCodeError(f"set_{form}: give a function or version=N, not both")
            return self._roll_to(registry, version)
        previous, candidate = registry.live(KIND), registry.next_version(KIND)
        code = None
        try:
            code = fn if isinstance(fn, LiveCode) else capture_callable(form, fn)  # (captured by a client already)
            members = {KIND: Member(code), **{f"tool:{t.name}": Member(t) for t in _tools(tools)}}
            validation = self._check(agent_code(members), candidate)
        except LiveCodeError as e:
            registry.reject(KIND, KIND, code or LiveCode(form, "", repr(fn), "cell"), {"error": str(e)}, candidate)
            raise LiveCodeError(
                f"{form} v{candidate} ({getattr(code, 'origin', 'cell')}): {e} -- v{previous.version} stays live"
            ) from None
        record = registry.accept(KIND, KIND, members, validation)
        self._ship(registry, record.version)
        return record.version

    def restore(self) -> None:
        """After a start from a checkpoint: the env procs run its live rollout again."""
        registry = self._registry()
        if any(r.kind == KIND for r in registry.records) and registry.live(KIND).version > 0:
            self._ship(registry, registry.live(KIND).version)

    def _roll_to(self, registry: Registry, version: int) -> int:
        try:
            registry.get(KIND, version)
        except KeyError as e:
            raise LiveCodeError(f"set_rollout: {e.args[0]} -- v{registry.live(KIND).version} stays live") from None
        self._ship(registry, version)
        registry.make_live(KIND, version)
        return version

    def _ship(self, registry: Registry, version: int) -> None:
        agent = agent_code(registry.get(KIND, version).members)
        with self._lock:
            self._envs.set_rollout(agent, version)

    def _check(self, agent: AgentCode, version: int) -> dict:
        """Run `agent` on probe rows in the env procs -> validation record; `LiveCodeError` saying why not."""
        start = time.perf_counter()
        try:
            trajectories = self._probe(agent)
        except Exception as e:  # raised where it runs (an actor error): its last line says why
            raise LiveCodeError(f"could not run: {str(e).strip().splitlines()[-1]}") from None
        failed = [t for t in trajectories if t.finish_reason == "error"]
        if failed and len(failed) == len(trajectories):
            t = failed[0]
            raise LiveCodeError(f"failed on every probe row; row {t.group} turn {len(t.turns)}: {t.error}")
        # An environment may end at the limits as a game does (truncated); an agent loop that never returns
        # on any probe row loops forever.
        if agent.form == "rollout" and all(t.finish_reason in ("max_turns", "max_tokens") for t in trajectories):
            t = trajectories[0]
            raise LiveCodeError(
                f"no probe trajectory finished within the limits (row {t.group}: {t.finish_reason} after "
                f"{len(t.turns)} turns, {t.num_tokens} tokens; see agent.max_turns / agent.max_total_tokens, which "
                "counts the first prompt and its tools block too)"
            )
        return {
            "seconds": time.perf_counter() - start,
            "probe_size": len(trajectories),
            "error": None,
            "probe_failed": len(failed),
            "probe_turns": [t.num_turns for t in trajectories],
        }


def _tools(tools: Sequence[Callable]) -> list[LiveCode]:
    out = []
    for tool in tools:
        if isinstance(tool, LiveCode):
            out.append(tool)
            continue
        if not callable(tool) or isinstance(tool, type):
            raise LiveCodeError(f"tools: {tool!r} is not a function")
        out.append(capture_callable("tool", tool))
    return out
