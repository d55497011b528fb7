"""The endpoint row of `benchmarks/agents.py`: trajectories/s of the same agent through the OpenAI-compatible
HTTP endpoint (a real `openai.AsyncOpenAI` per trajectory, JSON over TCP to uvicorn, the server-side client)
vs forge_nb's in-process client, side by side in one process on one torch engine.

Both sides: the same rows, `expression_rollout` (two model calls and one calculator call per trajectory), greedy
sampling (seeded sampling would not give the same tokens: which calls share an engine batch depends on when they
arrive, and each batch draws its own random numbers; the table shows the model calls and generated tokens of each
side's timed rounds, equal when the work is), all trajectories of a round concurrent, their calls batched into
engine calls (`GenerationBatcher`); rounds alternate between the sides, the first of each left out as warm-up.
Ratio: HTTP traj/s / in-process traj/s.

    python benchmarks/agents.py --endpoint-only [--prompts 4] [--group 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch

from forge_nb.agents import Limits, engine_backend, run_rollouts
from forge_nb.agents.endpoint import Endpoint
from forge_nb.agents.tasks.calculator import calculator, calculator_problems, expression_rollout
from forge_nb.engines.base import SamplingParams
from forge_nb.engines.torch_engine import TorchEngine
from forge_nb.models.registry import resolve_model


def endpoint_table(args: argparse.Namespace, model: str) -> None:
    """Print the endpoint vs in-process table (median over `args.rounds` timed rounds per side)."""
    torch.set_num_threads(args.threads)
    directory = resolve_model(model)
    engine = TorchEngine.load(directory)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    rows = calculator_problems(args.prompts, seed=args.seed, top=args.top)
    endpoint = Endpoint().start()
    sides = {"in-process client": None, "HTTP endpoint (AsyncOpenAI)": endpoint}
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    work: dict[str, list[int]] = {name: [0, 0] for name in sides}
    try:
        for round_ in range(args.rounds + 1):
            for name, served in sides.items():
                took, calls, tokens = _round(engine, tokenizer, rows, args, served, round_)
                if round_:  # the first round of each side warms up
                    seconds[name].append(took)
                    work[name][0] += calls
                    work[name][1] += tokens
    finally:
        endpoint.stop()
    n = args.prompts * args.group
    print(
        f"\nendpoint vs in-process client: {args.prompts} prompts x {args.group} trajectories of expression_rollout "
        f"per round, greedy, torch engine, {args.threads} thread(s), {args.rounds} timed rounds per side (median, "
        "min-max; calls and tokens: all timed rounds)"
    )
    print(f"{'':<30}{'s/round':>9}{'min-max':>14}{'traj/s':>8}{'calls':>7}{'tokens':>8}{'ratio':>7}")
    base = n / statistics.median(seconds["in-process client"])
    for name in sides:
        median, calls_tokens = statistics.median(seconds[name]), work[name]
        spread = f"{min(seconds[name]):.2f}-{max(seconds[name]):.2f}"
        print(
            f"{name:<30}{median:>9.2f}{spread:>14}{n / median:>8.2f}{calls_tokens[0]:>7}{calls_tokens[1]:>8}"
            f"{n / median / base:>6.2f}x"
        )
    print(f"requests the endpoint served: {endpoint.requests}")


def _round(engine, tokenizer, rows, args, served, round_: int) -> tuple[float, int, int]:
    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, seed=args.seed + round_)
    limits = Limits(max_turns=4, max_total_tokens=args.max_total_tokens, max_tokens=args.max_tokens)
    start = time.perf_counter()
    trajectories = asyncio.run(
        run_rollouts(
            engine_backend(engine),
            tokenizer,
            rows,
            rollout=expression_rollout,
            group_size=args.group,
            limits=limits,
            sampling=sampling,
            tools=[calculator],
            endpoint=served,
        )
    )
    took = time.perf_counter() - start
    errors = [t.error for t in trajectories if t.finish_reason == "error"]
    if errors:
        raise RuntimeError(f"a trajectory failed: {errors[0]}")
    return took, sum(t.num_turns for t in trajectories), sum(sum(t.loss_mask()) for t in trajectories)
