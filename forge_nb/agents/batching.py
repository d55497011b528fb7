"""Batching concurrent model calls: the turns of many trajectories go to the backend together.

Each trajectory runs as an asyncio task and awaits `GenerationBatcher.generate(prompt_ids, sampling)`
for one completion. Calls that arrive within `window_s` of each other (or while the backend is busy
with the previous batch) are sent as ONE backend call per distinct `SamplingParams`, so generation
never waits for trajectories one turn at a time. One backend call runs at a time: a generator serves
one batch after another, and the next batch fills while the current one generates.

A backend is ``generate(prompt_ids: list[list[int]], sampling) -> list[Completion]`` (one completion,
`sampling.n == 1`, per prompt; `engines.base.Completion`), sync or async. A sync backend runs in a
worker thread so tools and environments of other trajectories keep running meanwhile.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from forge_nb.engines.base import Completion, SamplingParams

Backend = Callable[[list[list[int]], SamplingParams], list[Completion] | Awaitable[list[Completion]]]


@dataclass
class _Call:
    prompt_ids: list[int]
    sampling: SamplingParams
    done: asyncio.Future = field(repr=False)


class GenerationBatcher:
    """Gathers concurrent single-prompt calls into backend batches of at most `max_batch` prompts.

    `batch_sizes` lists the size of every batch sent (for metrics and tests).
    """

    def __init__(self, backend: Backend, window_s: float = 0.01, max_batch: int = 256) -> None:
        self.backend = backend
        self.window_s = window_s
        self.max_batch = max_batch
        self.batch_sizes: list[int] = []
        self._pending: list[_Call] = []
        self._drainer: asyncio.Task | None = None

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        """One completion of `prompt_ids` [P] (sampled in a batch with whatever else is waiting)."""
        if sampling.n != 1:
            raise ValueError(f"one completion per call: sampling.n must be 1, got {sampling.n}")
        call = _Call(list(prompt_ids), sampling, asyncio.get_running_loop().create_future())
        self._pending.append(call)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await call.done

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(self.window_s)  # let the calls of concurrent trajectories arrive
            calls, self._pending = self._pending, []
            groups: dict[SamplingParams, list[_Call]] = {}
            for call in calls:
                groups.setdefault(call.sampling, []).append(call)
            for sampling, group in groups.items():
                for start in range(0, len(group), self.max_batch):
                    await self._send(sampling, group[start : start + self.max_batch])

    async def _send(self, sampling: SamplingParams, calls: list[_Call]) -> None:
        self.batch_sizes.append(len(calls))
        prompts = [c.prompt_ids for c in calls]
        try:
            if is_async(self.backend):
                out = await self.backend(prompts, sampling)
            else:
                out = await asyncio.to_thread(self.backend, prompts, sampling)
            if len(out) != len(calls):
                raise RuntimeError(f"the backend returned {len(out)} completions for {len(calls)} prompts")
        except Exception as e:  # noqa: BLE001 - every waiting trajectory gets the backend's error
            for c in calls:
                if not c.done.done():
                    c.done.set_exception(e)
            return
        for c, completion in zip(calls, out):
            if not c.done.done():
                c.done.set_result(completion)


def is_async(fn: Callable) -> bool:
    """Whether calling `fn` (a function, a partial of one, or an object with ``__call__``) gives a coroutine."""
    return inspect.iscoroutinefunction(fn) or (callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))
