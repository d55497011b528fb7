"""The `agent` section: limits of multi-turn rollouts (`Session.set_rollout`, `Session.set_env`)."""

from __future__ import annotations

from dataclasses import dataclass

from forge_nb.config.sections import ConfigError


@dataclass
class AgentConfig:
    """One trajectory ends at `max_turns` model calls ("max_turns") or when its tokens (the first prompt,
    tools block included, and every turn's additions and replies) would pass `max_total_tokens` ("max_tokens");
    each reply is at most `engine.max_tokens` long. A tool call gets `tool_timeout_s`; a whole batch of
    rollouts `batch_timeout_s` (past it the env procs are replaced and the step fails, saying so)."""

    max_turns: int = 4
    max_total_tokens: int = 1024
    tool_timeout_s: float = 10.0
    batch_timeout_s: float = 600.0

    def validate(self) -> None:
        if self.max_turns < 1:
            raise ConfigError(f"agent.max_turns must be >= 1, got {self.max_turns}")
        if self.max_total_tokens < 1:
            raise ConfigError(f"agent.max_total_tokens must be >= 1, got {self.max_total_tokens}")
        for name in ("tool_timeout_s", "batch_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"agent.{name} must be > 0, got {getattr(self, name)}")
