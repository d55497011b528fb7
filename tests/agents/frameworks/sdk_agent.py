"""A calculator agent written with the OpenAI Agents SDK (`openai-agents`), as its docs write one."""

from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

from forge_nb.agents.tasks.calculator import answer_reward

set_tracing_disabled(True)  # the SDK would export traces to OpenAI's servers


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


async def sdk_rollout(client, row, **context) -> float:
    """The SDK's agent loop on the policy: `client` is the trajectory's `openai.AsyncOpenAI`."""
    agent = Agent(
        name="calculator",
        instructions="Answer the question. Use the add tool to add numbers.",
        tools=[add],
        model=OpenAIChatCompletionsModel(model="forge_nb-policy", openai_client=client),
        model_settings=ModelSettings(max_tokens=24),
    )
    result = await Runner.run(agent, row["prompt"][-1]["content"], max_turns=3)
    return answer_reward(str(result.final_output), row["answer"])
