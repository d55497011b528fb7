"""Agents that run outside forge_nb's procs: another process, a sandbox, a container on this machine.

    ep = s.endpoint()                        # the session's OpenAI-compatible endpoint (127.0.0.1)
    with s.trajectory(row) as t:             # one trajectory of `row` ({"prompt": ..., "answer": ...})
        agent(base_url=t.base_url, api_key=t.api_key)     # any process, any framework, plain HTTP
        t.reward(1.0)                        # optional: else the live rewards score the last reply
    s.step()                                 # trains on the closed trajectories (see below)

The endpoint runs in the kernel (`agents.endpoint`), its calls go to the generator replicas in batches
(`agents.batching`), and every call's token ids and logprobs are recorded into the trajectory, as for
rollouts in the env procs. A closed trajectory waits in `pending`; the next batch (`s.rollout()`,
`s.step()`) trains on waiting trajectories instead of generating, when at least one group is complete:
`algorithm.group_size` trajectories of the same row (its "prompt_id", else its prompt) are a GRPO group.
Up to `algorithm.prompts_per_step` complete groups are taken, oldest first; the rest keep waiting.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from forge_nb.agents.backend import grouped
from forge_nb.agents.batching import GenerationBatcher
from forge_nb.agents.client import AgentClient, Limits
from forge_nb.agents.endpoint import Endpoint
from forge_nb.agents.trajectory import Trajectory
from forge_nb.engines.base import Completion, SamplingParams
from forge_nb.tasks.base import Problem

# The generator on token ids: prompts [B][P_i] -> (one group of completions per prompt, the policy version).
Generate = Callable[[list[list[int]], SamplingParams], tuple[list[list[Completion]], int]]


@dataclass
class OpenTrajectory:
    """What an outside agent needs: its `base_url` and `api_key`; `reward(x)` sets the trajectory's reward."""

    id: str
    base_url: str
    api_key: str
    trajectory: Trajectory = field(repr=False)

    def reward(self, value: float) -> None:
        self.trajectory.reward = float(value)


class ExternalAgents:
    """The session's endpoint and the trajectories outside agents closed, waiting for a batch.

    `generate(prompt_ids, sampling) -> one group of completions per prompt` is the generator
    (`Fleet.generate` on token ids); `sampling` gives every call's defaults, `limits` each trajectory's; the
    endpoint listens on `host` (127.0.0.1: this machine only; an address of the mesh's network for agents on
    other hosts: every request still needs the token)."""

    def __init__(
        self, tokenizer, generate: Generate, sampling: SamplingParams, limits: Limits, host: str = "127.0.0.1"
    ) -> None:
        self.tokenizer, self.sampling, self.limits = tokenizer, sampling, limits
        self.endpoint = Endpoint(host).start()
        self.versions: list[int] = []  # the policy version of every batch generated, in order
        self.batcher = GenerationBatcher(self._backend(generate))
        self.pending: list[Trajectory] = []
        self._lock = threading.Lock()
        self._opened = 0

    @property
    def url(self) -> str:
        """The OpenAI base URL of the endpoint's models route; trajectories have their own (`trajectory`)."""
        return f"{self.endpoint.url}/v1"

    @property
    def api_key(self) -> str:
        return self.endpoint.token

    @contextmanager
    def trajectory(self, row: dict) -> Iterator[OpenTrajectory]:
        """Open one trajectory of `row` for an outside agent; on leaving the block it is closed (later calls
        get 404) and waits for the next batch. An exception in the block, or no model call at all, records the
        trajectory as failed ("error": kept in its group, not trained); an exception is raised again."""
        if "prompt" not in row:
            raise ValueError("s.trajectory(row): the row needs a 'prompt' (text or chat messages)")
        trajectory = Trajectory(row=dict(row), sample=self._count())
        client = AgentClient(self.batcher, self.tokenizer, trajectory, self.limits, self.sampling)
        tid = self.endpoint.open(client)
        opened = OpenTrajectory(tid, self.endpoint.base_url(tid), self.endpoint.token, trajectory)
        first, start = len(self.versions), time.perf_counter()
        try:
            yield opened
            trajectory.finish_reason = client.limit or ("max_tokens" if client.budget_exhausted else "stop")
            if not trajectory.turns:
                trajectory.finish_reason, trajectory.error = "error", "the agent made no model call on its URL"
        except BaseException as e:
            trajectory.finish_reason, trajectory.error = "error", f"{type(e).__name__}: {e}"
            raise
        finally:
            self.endpoint.close(tid)
            trajectory.info["policy_versions"] = sorted(set(self.versions[first:])) or self.versions[-1:] or [0]
            trajectory.info["seconds"] = time.perf_counter() - start
            with self._lock:
                self.pending.append(trajectory)

    def take(self, group_size: int, groups: int) -> tuple[list[Trajectory], list[Problem]]:
        """Up to `groups` complete groups of waiting trajectories, oldest first -> (trajectories in
        row-major order with `group`/`sample` set, one problem per group). Empty when none is complete."""
        with self._lock:
            by_row: dict[str, list[Trajectory]] = {}
            for t in self.pending:
                by_row.setdefault(_row_key(t.row), []).append(t)
            ready = [ts[:group_size] for ts in by_row.values() if len(ts) >= group_size][:groups]
            taken = {id(t) for ts in ready for t in ts}
            self.pending = [t for t in self.pending if id(t) not in taken]
        trajectories = [replace(t, group=g, sample=j) for g, ts in enumerate(ready) for j, t in enumerate(ts)]
        return trajectories, [_problem(ts[0].row) for ts in ready]

    def stop(self) -> None:
        self.endpoint.stop()

    def _backend(self, generate: Generate):
        def backend(prompt_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
            prompts, sampling, spread = grouped(prompt_ids, sampling)
            groups, version = generate(prompts, sampling)
            self.versions.append(version)
            return spread(groups)

        return backend

    def _count(self) -> int:
        with self._lock:
            self._opened += 1
            return self._opened


def _row_key(row: dict) -> str:
    return str(row.get("prompt_id") or json.dumps(row["prompt"], sort_keys=True))


def _problem(row: dict) -> Problem:
    extras = {k: v for k, v in row.items() if k not in ("prompt", "target", "answer", "prompt_id")}
    target = str(row.get("target", row.get("answer", "")))
    key = _row_key(row)
    prompt_id = key if "prompt_id" in row else "external-" + hashlib.sha1(key.encode()).hexdigest()[:10]
    return Problem(prompt_id, row["prompt"], target, extras)
