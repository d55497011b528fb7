"""Agents: SmolLM2-135M-Instruct learns a calculator-tool agent, held-out accuracy before -> after `--minutes` of
GRPO on this machine, and trajectories/s vs TRL's GRPOTrainer running the same agent, same model, task and batch, in
one run.

Task: `forge_nb.agents.tasks.calculator` word problems (seeded; `--train` rows to train on, `--heldout` others from a
disjoint seed). The agent is `expression_rollout`, two turns: the model writes the calculation, the agent loop runs
it on the `calculator` tool, the model answers from the result; reward 1.0 when the answer's last number is the
target, plus 0.2 on the first turn for writing a calculation the tool can run. (SmolLM2-135M never writes a tool call
of its own -- 0 of 32 samples, also with a worked example in the prompt -- so the agent loop decides when the tool
runs; `calculator_rollout`, where the model decides, is the same code path with the model's tool calls parsed.)
Held-out accuracy: greedy, every held-out row as a trajectory of the agent (`s.evaluate()`); the verifier reads the
last reply.

Both sides: P prompts x G trajectories per optimizer step, temperature 1, at most `--max-tokens` new tokens per model
call, the same token ids (TRL's side renders the turns with forge_nb's `next_prompt_ids`, the same chat template and
glue), the GRPO loss (ratio clip 0.2, group-normalised advantages, no KL), the calculator's result and the template's
glue masked out of the loss (TRL: `env_mask`), AdamW at `--lr`, grad-norm clip 1.0, float32 on the CPU. TRL runs the
agent as its `rollout_func` (its interface for environments and custom multi-turn rollouts) with HF `generate`, every
turn of all trajectories in one batch, in this process; forge_nb runs its mesh (generator, trainer, reward and env
procs, `--threads` torch threads each) with `--engine`. forge_nb's trainer leaves zero-advantage trajectories out of
its forward/backward (same loss and update; TRL does not), so the table also has forge_nb without that skip
(`--noskip-steps` steps with the same loss given as a live loss, which is never skipped, timed first: from the same
untrained weights as TRL's steps, so with about as many model calls per trajectory).

    python benchmarks/agents.py [--minutes 5] [--prompts 4] [--group 4] [--max-tokens 24] [--trl-steps 3]

Then the endpoint row (`agent_endpoint`): the same agent's trajectories/s through the OpenAI-compatible HTTP
endpoint vs the in-process client (`--endpoint-only` runs just that table).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from agent_endpoint import endpoint_table
from trl_baseline import NOSKIP_LOSS, grpo_config, median_step_s, step_clock

from forge_nb.agents.tasks.calculator import (
    ANSWER_PROMPT,
    EXPRESSION,
    EXPRESSION_BONUS,
    EXPRESSION_PROMPT,
    answer_reward,
    calculator,
    calculator_problems,
    expression_rollout,
)
from forge_nb.session import Session

MODEL = "smollm2-135m-instruct"


def data(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    train = calculator_problems(args.train, seed=args.seed, top=args.top)
    seen = {r["prompt"][-1]["content"] for r in train}
    others = calculator_problems(args.heldout * 3, seed=args.seed + 1, top=args.top)
    return train, [r for r in others if r["prompt"][-1]["content"] not in seen][: args.heldout]


def forge_nb_run(args: argparse.Namespace, train: list[dict], heldout: list[dict]) -> dict:
    """Evaluate, train for `args.minutes`, evaluate; then time steps without the zero-advantage skip."""
    s = Session.up(
        model=MODEL,
        task={"train": train, "eval": heldout},
        eval_size=len(heldout),
        engine=args.engine,
        prompts_per_step=args.prompts,
        group_size=args.group,
        max_tokens=args.max_tokens,
        max_turns=2,
        max_total_tokens=args.max_total_tokens,
        temperature=1.0,
        lr=args.lr,
        loss="grpo",
        threads_per_proc=args.threads,
        seed=args.seed,
    )
    try:
        s.set_rollout(expression_rollout, tools=[calculator])
        before = s.evaluate()
        print(f"forge_nb: held-out accuracy before {before['heldout_accuracy']:.3f} ({before['eval_s']:.0f} s)")
        noskip = []
        if args.noskip_steps:  # first, from the same untrained weights as TRL: the same work (turns) as its steps
            s.set_loss(NOSKIP_LOSS)
            noskip = s.step(args.noskip_steps + args.warmup, progress=False).iloc[args.warmup :]
            s.set_loss(version=0)
        rows, deadline = [], time.perf_counter() + args.minutes * 60
        while time.perf_counter() < deadline:
            row = s.step(1, progress=False).iloc[0]
            rows.append(row)
            print(
                f"  step {len(rows):3d}: reward {row.mean_reward:.3f}, accuracy {row.accuracy:.3f}, "
                f"{row.turns:.2f} turns/traj, {row.tool_calls} tool calls, {row.step_s:.1f} s "
                f"(generate {row.generate_s:.1f}, train {row.train_s:.1f}, refresh {row.refresh_s:.2f})",
                flush=True,
            )
        after = s.evaluate()
        print(f"forge_nb: held-out accuracy after {after['heldout_accuracy']:.3f}", flush=True)
        timed = rows[args.warmup :] or rows
        train_rows = s.metrics_stream.to_pandas("train").iloc[args.warmup + len(noskip) + args.warmup :]
        skipped, trained = train_rows.rows_skipped.sum(), len(train_rows) * args.prompts * args.group
    finally:
        s.down()
    n = args.prompts * args.group
    first, last = rows[: len(rows) // 4 or 1], rows[-(len(rows) // 4 or 1) :]
    return {
        "before": before["heldout_accuracy"],
        "after": after["heldout_accuracy"],
        "steps": len(rows),
        "reward_first": statistics.fmean(r.mean_reward for r in first),
        "reward_last": statistics.fmean(r.mean_reward for r in last),
        "tools_first": statistics.fmean(r.tool_calls for r in first) / n,
        "tools_last": statistics.fmean(r.tool_calls for r in last) / n,
        "step_s": statistics.median(r.step_s for r in timed),
        "generate_s": statistics.median(r.generate_s for r in timed),
        "noskip_step_s": statistics.median(noskip.step_s) if len(noskip) else float("nan"),
        "noskip_turns": statistics.fmean(noskip.turns) if len(noskip) else float("nan"),
        "turns": statistics.fmean(r.turns for r in timed),
        "skipped_share": skipped / max(1, trained),
    }


def trl_agent(args: argparse.Namespace, tokenizer, counts: dict):
    """`expression_rollout` as TRL's `rollout_func`: each turn of every trajectory in one HF `generate` call."""
    from forge_nb.agents.tool_calls import render
    from forge_nb.agents.trajectory import next_prompt_ids

    def generate(model, prompts: list[list[int]]) -> tuple[list[list[int]], list[list[float]]]:
        width = max(map(len, prompts))
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                max_new_tokens=args.max_tokens, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, output_scores=True, return_dict_in_generate=True,
                disable_compile=True,  # as TRL's own generation config
            )  # fmt: skip
        logprobs = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        completions, lps = [], []
        for row, lp in zip(out.sequences[:, width:].tolist(), logprobs.tolist()):
            end = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
            completions.append(row[:end])
            lps.append(lp[:end])
        return completions, lps

    def run(found) -> str:  # as forge_nb's ToolSet reports a tool that raises
        try:
            return calculator(found.group())
        except Exception as e:  # noqa: BLE001
            return f"Error: tool calculator raised {type(e).__name__}: {e}"

    def rollout_func(prompts: list, trainer) -> dict:
        model = trainer.accelerator.unwrap_model(trainer.model)
        training, _ = model.training, model.eval()  # no dropout while sampling, as TRL's own generation
        history = [[{"role": "system", "content": EXPRESSION_PROMPT}, p[-1]] for p in prompts]
        first = [tokenizer(render(tokenizer, h), add_special_tokens=False)["input_ids"] for h in history]
        replies, logprobs = generate(model, first)
        out = {"completion_ids": [], "logprobs": [], "env_mask": [], "bonus": [0.0] * len(prompts)}
        out["final_reply"] = [None] * len(prompts)  # the answer turn's text, scored by the reward with the row's answer
        second, who = [], []
        for i, (reply, lp) in enumerate(zip(replies, logprobs)):
            found = EXPRESSION.search(tokenizer.decode(reply, skip_special_tokens=True))
            out["completion_ids"].append(list(reply))
            out["logprobs"].append(list(lp))
            out["env_mask"].append([1] * len(reply))
            counts["turns"] += 1
            if found is None:
                continue
            counts["tool_calls"] += 1
            out["bonus"][i] = EXPRESSION_BONUS
            message = {"role": "user", "content": ANSWER_PROMPT.format(expression=found.group(), result=run(found))}
            prompt, delta = next_prompt_ids(tokenizer, first[i], reply, history[i], [message])
            out["completion_ids"][i] += delta
            out["logprobs"][i] += [0.0] * len(delta)
            out["env_mask"][i] += [0] * len(delta)
            second.append(prompt)
            who.append(i)
        if second:
            answers, lps = generate(model, second)
            for i, answer, lp in zip(who, answers, lps):
                out["completion_ids"][i] += answer
                out["logprobs"][i] += lp
                out["env_mask"][i] += [1] * len(answer)
                out["final_reply"][i] = tokenizer.decode(answer, skip_special_tokens=True)
                counts["turns"] += 1
        counts["trajectories"] += len(prompts)
        model.train(training)
        out["prompt_ids"] = first
        return out

    return rollout_func


def trl_run(args: argparse.Namespace, train: list[dict]) -> dict:
    """TRL's median seconds per step over `args.trl_steps` steps after one warm-up step, turns and tool calls."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from forge_nb.models import resolve_model

    counts = {"trajectories": 0, "tool_calls": 0, "turns": 0, "reward": 0.0}

    def reward(completions, answer, final_reply, bonus, **_) -> list[float]:
        scores = [b + (answer_reward(f, a) if f is not None else 0.0) for a, f, b in zip(answer, final_reply, bonus)]
        counts["reward"] += sum(scores)
        return scores

    path = str(resolve_model(MODEL))
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = grpo_config(
        "/tmp/forge_nb_agents_trl",
        args.prompts * args.group,
        args.group,
        args.max_total_tokens,
        args.lr,
        1 + args.trl_steps,
        args.seed,
    )
    times = step_clock()
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in train]),
        processing_class=tokenizer,
        rollout_func=trl_agent(args, tokenizer, counts),
        callbacks=[times],
    )
    start = time.perf_counter()
    trainer.train()
    n = max(1, counts["trajectories"])
    return {
        "step_s": median_step_s(start, times.times),
        "turns": counts["turns"] / n,
        "tool_calls": counts["tool_calls"] / n,
        "reward": counts["reward"] / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0, help="forge_nb training time")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--top", type=int, default=40, help="largest number in the problems")
    parser.add_argument("--max-tokens", type=int, default=24, help="new tokens per model call")
    parser.add_argument("--max-total-tokens", type=int, default=400, help="tokens per trajectory, prompt included")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--train", type=int, default=400)
    parser.add_argument("--heldout", type=int, default=50)
    parser.add_argument("--engine", default="torch")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per forge_nb proc (TRL: the same)")
    parser.add_argument("--warmup", type=int, default=1, help="forge_nb steps left out of the timing")
    parser.add_argument("--noskip-steps", type=int, default=3)
    parser.add_argument("--trl-steps", type=int, default=3, help="timed TRL steps (after one warm-up step)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per side of the endpoint table")
    parser.add_argument("--endpoint-only", action="store_true", help="only the endpoint vs in-process table")
    args = parser.parse_args()
    if args.endpoint_only:
        endpoint_table(args, MODEL)
        return
    train, heldout = data(args)
    ours = forge_nb_run(args, train, heldout)
    torch.set_num_threads(args.threads)
    trl = trl_run(args, train)
    n = args.prompts * args.group
    print(
        f"\n{MODEL}, calculator agent (write the calculation, the tool runs it, answer) on word problems "
        f"({len(train)} train, {len(heldout)} held out), {args.prompts} prompts x {args.group} trajectories per step, "
        f"2 model calls x <= {args.max_tokens} new tokens, GRPO, lr {args.lr:g}, float32 CPU, forge_nb "
        f"{args.engine} engine with {args.threads} thread(s) per proc\n"
    )
    print(
        f"held-out accuracy (greedy, agent): {ours['before']:.3f} -> {ours['after']:.3f} after {ours['steps']} steps "
        f"({args.minutes:g} min); mean reward first quarter of the steps {ours['reward_first']:.3f} -> last "
        f"{ours['reward_last']:.3f}; "
        f"tool calls per trajectory {ours['tools_first']:.2f} -> {ours['tools_last']:.2f}\n"
    )
    table = [  # (name, s/step, model calls per trajectory)
        ("forge_nb, no skip (same work as TRL)", ours["noskip_step_s"], ours["noskip_turns"]),
        ("TRL GRPOTrainer 1.16.0, rollout_func", trl["step_s"], trl["turns"]),
        ("forge_nb, zero-advantage skip, while learning", ours["step_s"], ours["turns"]),
    ]
    trl_calls = n * trl["turns"] / trl["step_s"]
    print(f"{'':<48}{'s/step':>8}{'calls/traj':>11}{'traj/s':>8}{'vs TRL':>8}{'calls/s':>9}{'vs TRL':>8}")
    for name, seconds, turns in table:
        calls = n * turns / seconds
        print(
            f"{name:<48}{seconds:>8.2f}{turns:>11.2f}{n / seconds:>8.3f}{trl['step_s'] / seconds:>7.2f}x"
            f"{calls:>9.3f}{calls / trl_calls:>7.2f}x"
        )
    print(
        f"\nforge_nb generation only (while learning): {ours['generate_s']:.2f} s/step; trajectories skipped by its "
        f"trainer (zero advantage): {ours['skipped_share']:.0%}; TRL: {trl['tool_calls']:.2f} tool calls per "
        f"trajectory, mean reward {trl['reward']:.3f} (its steps, from the untrained model)"
    )
    endpoint_table(args, MODEL)


if __name__ == "__main__":
    main()
