"""The Tinker API's cost over the session's own calls, and what pipelining buys, in one run on one session.

The rollouts are `forge_nb.tasks.word_problems` (chat messages through the model's template; the reward is the final
number against the answer), as benchmarks/real_model.py trains them.

1. GRPO-style batches of one shape (the session's config) trained two ways, each on a fresh rollout of its own
   (so the datums trained differ from side to side; the Tinker side's count is printed): `s.train(r)` (the
   session's GRPO step on a rollout `r`), and through the `tinker` SDK: the rollout's samples as Tinker datums
   (prompt + completion, the sampler's logprobs, the sample's advantage on its completion tokens; zero-advantage
   samples left out, as the cookbook leaves out constant-reward groups and as the session's trainer skips them),
   `forward_backward(importance_sampling)` then `optim_step`, from the first request to the optim_step's result.
   Each side trains `--repeats` fresh rollouts (after one warm-up each); the medians, their spread and their ratio
   are printed.
2. Pipelined vs one-at-a-time: the batch split into `--chunks` forward_backward calls plus an optim_step, sent
   all at once (then the results read) or each awaited before the next; and `--samples` sample requests of the
   rollout's prompts, all at once or one after another.

    python benchmarks/tinker_api.py [--model smollm2-135m-instruct] [--prompts 4] [--group 4] [--max-tokens 32]
                                    [--repeats 3] [--chunks 4] [--samples 8] [--threads 2]

A session of its own (`forge_nb.up`, LoRA rank `--rank`); the SDK runs in this process, the API in the session's
server, as a user's script and session would. Times are wall seconds on this machine (`n` = --repeats per cell).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import forge_nb
from forge_nb.tasks.word_problems import word_problems


def datums(episodes, types) -> list:
    """A rollout's samples with a non-zero advantage as importance_sampling datums (Tinker's RL layout: the
    sequence shifted by one, sampler logprobs and advantages on the completion's positions, 0 on the prompt's)."""
    out = []
    for e in episodes:
        if e.advantage == 0:
            continue
        tokens = e.prompt_ids + e.completion_ids
        prompt = len(e.prompt_ids) - 1  # positions that predict a prompt token
        out.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": tokens[1:],
                    "logprobs": [0.0] * prompt + list(e.logprobs),
                    "advantages": [0.0] * prompt + [e.advantage] * len(e.completion_ids),
                },
            )
        )
    return out


def tinker_step(training, data, types, chunks: int = 1, pipelined: bool = True) -> float:
    """forward_backward over `data` in `chunks` calls, then optim_step -> seconds to the step's result."""
    parts = [data[i::chunks] for i in range(chunks)]
    start = time.perf_counter()
    if pipelined:
        futures = [training.forward_backward(p, "importance_sampling") for p in parts]
        step = training.optim_step(types.AdamParams(learning_rate=1e-5))
        for f in futures:
            f.result()
        step.result()
    else:
        for p in parts:
            training.forward_backward(p, "importance_sampling").result()
        training.optim_step(types.AdamParams(learning_rate=1e-5)).result()
    return time.perf_counter() - start


def sampling(sampler, prompts, types, max_tokens: int, pipelined: bool) -> float:
    params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0)
    start = time.perf_counter()
    if pipelined:
        futures = [sampler.sample(types.ModelInput.from_ints(p), 1, params) for p in prompts]
        for f in futures:
            f.result()
    else:
        for p in prompts:
            sampler.sample(types.ModelInput.from_ints(p), 1, params).result()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--micro-batch-tokens", type=int, default=1024)
    args = parser.parse_args()
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    import tinker
    from tinker import types

    s = forge_nb.up(
        name=f"tinker-bench-{os.getpid()}", persist=False, model=args.model, task=word_problems(64),
        lora={"r": args.rank},
        prompts_per_step=args.prompts, group_size=args.group, max_tokens=args.max_tokens, lr=1e-5,
        threads_per_proc=args.threads, micro_batch_tokens=args.micro_batch_tokens,
    )  # fmt: skip
    endpoint = s.serve_tinker()
    service = tinker.ServiceClient(base_url=endpoint.url, api_key=endpoint.api_key)
    training = service.create_lora_training_client(base_model=args.model, rank=args.rank).result()

    def rollout_with_signal():
        for _ in range(10):  # a batch whose every group has equal rewards trains nothing: draw another
            r = s.rollout()
            episodes = r.episodes
            if any(e.advantage != 0 for e in episodes):
                return r, episodes
        raise RuntimeError("ten rollouts without a non-zero advantage")

    session_s, tinker_s, rows = [], [], []
    for i in range(args.repeats + 1):  # the first of each: warm-up
        r, episodes = rollout_with_signal()
        start = time.perf_counter()
        s.train(r)
        trained = time.perf_counter() - start
        r, episodes = rollout_with_signal()
        data = datums(episodes, types)
        through_tinker = tinker_step(training, data, types)
        if i:
            session_s.append(trained)
            tinker_s.append(through_tinker)
            rows.append(len(data))
    one_by_one, pipelined = [], []
    for i in range(args.repeats + 1):
        r, episodes = rollout_with_signal()
        data = datums(episodes, types)
        a = tinker_step(training, data, types, args.chunks, pipelined=False)
        b = tinker_step(training, data, types, args.chunks, pipelined=True)
        if i:
            one_by_one.append(a)
            pipelined.append(b)
    sampler = training.save_weights_and_get_sampling_client().result()
    prompts = [e.prompt_ids for e in episodes[:: args.group]] * (args.samples // args.prompts + 1)
    prompts = prompts[: args.samples]
    sampling(sampler, prompts[:2], types, args.max_tokens, True)  # warm-up
    sample_one = [sampling(sampler, prompts, types, args.max_tokens, False) for _ in range(args.repeats)]
    sample_all = [sampling(sampler, prompts, types, args.max_tokens, True) for _ in range(args.repeats)]
    stats = s.status()["tinker"]
    service.close("success").result()
    s.down()

    med = statistics.median
    print(f"\n{args.model}, LoRA rank {args.rank}, {args.prompts} prompts x {args.group} samples, <= {args.max_tokens}")
    print(f"tokens; median of n={args.repeats} after one warm-up; Tinker datums per batch {rows}\n")

    def row(name: str, times: list[float], base: list[float]) -> str:
        return f"| {name} | {med(times):.2f} | {min(times):.2f}-{max(times):.2f} | {med(times) / med(base):.2f} |"

    print("| measure | median s | min-max s | ratio |\n|---|---|---|---|")
    print(row("GRPO batch via s.train", session_s, session_s))
    print(row("a batch via Tinker forward_backward + optim_step", tinker_s, session_s))
    print(row(f"{args.chunks} forward_backwards + optim_step, one at a time", one_by_one, one_by_one))
    print(row("the same, pipelined", pipelined, one_by_one))
    print(row(f"{args.samples} sample requests, one at a time", sample_one, sample_one))
    print(row("the same, all at once", sample_all, sample_one))
    print(
        f"\nqueues: {stats['forward_backward_requests']} forward_backward requests in {stats['trainer_calls']} trainer "
        f"calls, {stats['sample_requests']} sample requests in {stats['sampler_calls']} generator calls"
    )


if __name__ == "__main__":
    main()
