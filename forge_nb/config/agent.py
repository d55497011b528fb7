"""The `agent` section: limits of multi-turn rollouts (`Session.set_rollout`, `Session.set_env`)."""

from __future__ import annotations

from dataclasses import dataclass

from forge_nb.config.sections import ConfigError


@dataclass
class AgentConfig:
    """One trajectory ends at `max_turns` model calls ("max_turns") or when its tokens (the first prompt,
    tools block included, and every turn's additions and replies) would pass `max_total_tokens` ("max_tokens");
    each reply is at most `engine.max_tokens` long. A tool call gets `tool_timeout_s`; a whole batch of
    rollouts `batch_timeout_s` (past it the env procs are replaced and the step fails, saying so).

    `client` is what a rollout gets: "openai" (default) a real `openai.AsyncOpenAI` bound to its
    trajectory's URL on the env proc's OpenAI-compatible endpoint (what agent frameworks take), or
    "in_process" forge_nb's own duck-typed client (the same checks and records, no HTTP)."""

    max_turns: int = 4
    max_total_tokens: int = 1024
    tool_timeout_s: float = 10.0
    batch_timeout_s: float = 600.0
    client: str = "openai"

    def validate(self) -> None:
        if self.max_turns < 1:
            raise ConfigError(f"agent.max_turns must be >= 1, got {self.max_turns}")
        if self.max_total_tokens < 1:
            raise ConfigError(f"agent.max_total_tokens must be >= 1, got {self.max_total_tokens}")
        if self.client not in ("openai", "in_process"):
            raise ConfigError(f"agent.client must be 'openai' or 'in_process', got {self.client!r}")
        for name in ("tool_timeout_s", "batch_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"agent.{name} must be > 0, got {getattr(self, name)}")
