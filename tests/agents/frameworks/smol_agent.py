"""A calculator agent written with smolagents, as its docs write one: the model is built from a base URL
and an API key (smolagents makes its own `openai.OpenAI`), and the agent runs synchronously, so the
rollout runs it in a worker thread while the trajectory's calls are served."""

import asyncio

from smolagents import OpenAIServerModel, ToolCallingAgent, tool

from forge_nb.agents.tasks.calculator import answer_reward


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


async def smol_rollout(client, row, **context) -> float:
    """smolagents' tool-calling agent on the policy, through the trajectory's URL."""
    model = OpenAIServerModel(
        model_id="forge_nb-policy", api_base=str(client.base_url), api_key=client.api_key, max_tokens=24
    )
    agent = ToolCallingAgent(tools=[add], model=model, max_steps=1, verbosity_level=-1)
    answer = await asyncio.to_thread(agent.run, row["prompt"][-1]["content"])
    return answer_reward(str(answer), row["answer"])
