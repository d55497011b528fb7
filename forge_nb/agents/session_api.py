"""The session's side of agents outside the mesh: `s.endpoint()` and `s.trajectory(row)` (a mixin of
`Session`, kept here so the session stays one page; the work is in `agents.external`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from forge_nb.agents.client import Limits
from forge_nb.agents.external import ExternalAgents, OpenTrajectory
from forge_nb.engines.base import Completion, SamplingParams


class ExternalAgentsMixin:
    """`Session.endpoint` and `Session.trajectory`; the endpoint stops with the session (`_stop_endpoint`)."""

    def endpoint(self, host: str = "127.0.0.1") -> ExternalAgents:
        """The session's OpenAI-compatible endpoint (started on first use on `host`, stopped by `down`): `.url`
        and `.api_key` (the per-session token every request must carry), `.trajectory(row)`."""
        state = self.state  # type: ignore[attr-defined]
        self._require_up()  # type: ignore[attr-defined]
        if state.external is None:
            config = self.config  # type: ignore[attr-defined]
            limits = Limits(config.agent.max_turns, config.agent.max_total_tokens, config.engine.max_tokens)
            sampling = replace(state.sampling(1), seed=None)
            tokenizer = self.tokenizer  # type: ignore[attr-defined]
            state.external = ExternalAgents(tokenizer, self._generate_ids, sampling, limits, host)
        return state.external

    @contextmanager
    def trajectory(self, row: dict) -> Iterator[OpenTrajectory]:
        """One trajectory of `row` for an agent in another process: ``with s.trajectory(row) as t:`` gives
        `t.base_url` and `t.api_key`; `t.reward(x)` sets its reward. Closed trajectories train at the next
        batch once `algorithm.group_size` of the same row are in (`agents.external`)."""
        with self.endpoint().trajectory(row) as opened:
            yield opened

    def _generate_ids(self, prompts: list[list[int]], sampling: SamplingParams) -> tuple[list[list[Completion]], int]:
        with self.generation_lock:  # type: ignore[attr-defined]
            generation = self._require_up().generate(prompts, sampling)  # type: ignore[attr-defined]
        return generation.completions, generation.policy_version

    def _stop_endpoint(self) -> None:
        external, self.state.external = self.state.external, None  # type: ignore[attr-defined]
        if external is not None:
            external.stop()
