"""`make gpu-check` on a full GPU node (``--full``): the whole stack as a user runs it. A session on the local
Monarch mesh with vLLM's GPU engine and the trainer on the GPU, SmolLM2-135M-Instruct on sums, a few GRPO
steps with a refresh after each; then the served weights against the trainer's (checksums, and vLLM's
logprobs of a completion against the trainer's). Needs torchmonarch, vLLM's GPU build and the model."""

from __future__ import annotations

import argparse

ROWS = [
    {"q": f"What is {a} + {b}? Answer with the number only.", "a": str(a + b)} for a in range(3, 60, 3) for b in (4, 9)
]


def run_full(args: argparse.Namespace) -> int:
    """A few GRPO steps of the whole stack -> 0 when the served policy is the trained one, else 1."""
    from forge_nb.runtime.calls import wait
    from forge_nb.session import Session  # the controller here: the check reads the actors directly

    s = Session.up(
        model="smollm2-135m-instruct",
        task=ROWS,
        prompt_column="q",
        answer_column="a",
        engine="vllm",
        prompts_per_step=8,
        group_size=8,
        max_tokens=32,
        lr=1e-5,
    )
    try:
        status = s.status()
        steps = s.step(args.steps)
        print(steps.to_string())
        prompt = [s.tokenizer("What is 17 + 25?")["input_ids"]]
        completion = [s.tokenizer(" 42", add_special_tokens=False)["input_ids"]]
        served, version = wait(s.fleet.generator.slice(procs=0).logprobs.call_one(prompt, completion))
        trainer = wait(s.fleet.trainer.logprobs.call_one(prompt, completion))
        diff = max(abs(a - b) for a, b in zip(served[0], trainer[0]))
        print(
            f"\nengine {status['engine']}, weights transport {status['weights_transport']}; served policy "
            f"v{version}; |vLLM logprob - trainer's| on one completion: max {diff:.2e}"
        )
        return 0 if version == args.steps and diff < 0.05 else 1
    finally:
        s.down()
