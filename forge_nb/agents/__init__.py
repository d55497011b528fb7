"""Multi-turn agent rollouts: tools, an OpenAI-style client over forge_nb's generator, trajectories
with exact token ids and loss masks (in segments when a call does not extend the conversation), a runner
for agent loops and environments, and an OpenAI-compatible HTTP endpoint with one URL per trajectory
(`endpoint`, `http_api`, `responses_api`; a rollout's client is then a real `openai.AsyncOpenAI`).

Pure Python + torch + transformers + `openai` types + starlette/uvicorn (no Monarch): testable without a mesh.

    from forge_nb.agents import run_rollouts, engine_backend, Limits
    from forge_nb.agents.tasks import calculator, calculator_problems, calculator_rollout
    trajectories = await run_rollouts(engine_backend(engine), tokenizer, calculator_problems(4),
                                      rollout=calculator_rollout, group_size=4, tools=[calculator])
"""

from forge_nb.agents.backend import engine_backend
from forge_nb.agents.batching import Backend, GenerationBatcher
from forge_nb.agents.client import AgentClient, ConversationError, Limits, RolloutLimit
from forge_nb.agents.runner import Environment, drive_environment, run_rollouts
from forge_nb.agents.tool_calls import parse_tool_calls, render, template_renders_tools
from forge_nb.agents.tools import ToolResult, ToolSet, tool_schema
from forge_nb.agents.trajectory import FINISH_REASONS, TemplateRewriteError, Trajectory, Turn, next_prompt_ids

__all__ = [
    "FINISH_REASONS",
    "AgentClient",
    "Backend",
    "ConversationError",
    "Environment",
    "GenerationBatcher",
    "Limits",
    "RolloutLimit",
    "TemplateRewriteError",
    "ToolResult",
    "ToolSet",
    "Trajectory",
    "Turn",
    "drive_environment",
    "engine_backend",
    "next_prompt_ids",
    "parse_tool_calls",
    "render",
    "run_rollouts",
    "template_renders_tools",
    "tool_schema",
]
