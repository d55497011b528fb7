"""Agents: SmolLM2-135M-Instruct learns the calculator-tool task, held-out accuracy before -> after `--minutes` of
GRPO on this machine, and trajectories/s vs TRL's GRPOTrainer with its tool support, same model, task and batch, in
one run.

Task: `forge_nb.agents.tasks.calculator`: word problems (seeded; `--train` rows to train on, `--heldout` others from a
disjoint seed to evaluate on) whose system prompt offers the `calculator(expression)` tool; a trajectory is the model
answering or calling the tool, the tool's result going back to it, until it answers or runs out of turns; the reward
is 1.0 when the last number of its final answer is the target (`answer_reward`). Held-out accuracy: greedy, every
held-out row as a trajectory of the agent (`s.evaluate()`).

Both sides: P prompts x G trajectories per optimizer step, temperature 1, at most `--max-tokens` new tokens per model
call, at most `--max-turns` model calls per trajectory (TRL: `max_tool_calling_iterations` = max turns - 1, its first
generation plus one per round of tool results), at most `--max-completion-tokens` tokens after the first prompt
(replies, tool results and the template's glue; TRL's `max_completion_length`; forge_nb's `agent.max_total_tokens`
counts the first prompt too, so it is set to the longest first prompt of the data plus this budget), the GRPO
loss (sequence-level, ratio clip 0.2, group-normalised advantages, no KL), tool results and glue masked out of the
loss, AdamW at `--lr`, grad-norm clip 1.0, float32 on the CPU. The same prompt tokens: SmolLM2's chat template renders
no tools, so forge_nb writes them Hermes-style into the system prompt (`<tools>` block, `<tool_call>` JSON, tool
results as `<tool_response>` user turns); TRL gets that same convention as a chat template (`HERMES_CHAT_TEMPLATE`,
SmolLM2's ChatML plus the same tool rendering, checked token for token against forge_nb's rendering) and, for parsing
tool calls, TRL's own Qwen3 response template (ChatML with `<tool_call>` JSON blocks: the same format). TRL runs in
this process with HF `generate`; forge_nb runs its mesh (generator, trainer, reward and env procs, `--threads` torch
threads each) with `--engine`. forge_nb's trainer leaves zero-advantage trajectories out of its forward/backward (same
loss and update; TRL does not), so the table also has forge_nb without that skip (`--noskip-steps` more steps with the
same loss given as a live loss, which is never skipped).

    python benchmarks/agents.py [--minutes 10] [--prompts 4] [--group 4] [--max-tokens 48] [--max-turns 3]
        [--trl-steps 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import forge_nb
from forge_nb.agents.tasks.calculator import answer_reward, calculator, calculator_problems, calculator_rollout

MODEL = "smollm2-135m-instruct"

NOSKIP_LOSS = """
from forge_nb.rl.losses import grpo_loss


def loss(logprobs, old_logprobs, advantages, mask):
    return grpo_loss(logprobs, old_logprobs, advantages, mask, clip_eps=0.2)
"""

# SmolLM2's ChatML template plus the Hermes tool convention forge_nb writes into the messages for a template that
# renders no tools (`forge_nb.agents.tool_calls.hermes_messages`): the tools block at the end of the system prompt,
# an assistant's tool calls as <tool_call> blocks, a tool result as a <tool_response> user turn.
HERMES_CHAT_TEMPLATE = (
    "{%- set ns = namespace(block='') -%}"
    "{%- if tools -%}{%- set ns.block = 'You may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\\n' -%}"
    "{%- for tool in tools -%}{%- set ns.block = ns.block + (tool | tojson) + ('\\n' if not loop.last else '') -%}"
    "{%- endfor -%}"
    "{%- set ns.block = ns.block + '\\n</tools>\\n\\nFor each function call, return a json object with function name "
    'and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\\n</tool_call>' -%}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{%- if ns.block -%}{{ '<|im_start|>system\\n' + ns.block + '<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\\n' }}{%- endif -%}{%- endif -%}"
    "{%- set content = message['content'] or '' -%}"
    "{%- if message['role'] == 'system' and loop.first and ns.block -%}"
    "{{ '<|im_start|>system\\n' + ((content + '\\n\\n' + ns.block) if content else ns.block) + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' and message.get('tool_calls') and '<tool_call>' not in content -%}"
    "{{ '<|im_start|>assistant\\n' }}{%- if content -%}{{ content + '\\n' }}{%- endif -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set fn = call['function'] if call['function'] is defined else call -%}"
    "{{ '<tool_call>\\n' + ({'name': fn['name'], 'arguments': fn['arguments']} | tojson) + '\\n</tool_call>' }}"
    "{%- if not loop.last -%}{{ '\\n' }}{%- endif -%}{%- endfor -%}{{ '<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def data(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    train = calculator_problems(args.train, seed=args.seed, top=args.top)
    seen = {r["prompt"][-1]["content"] for r in train}
    others = calculator_problems(args.heldout * 3, seed=args.seed + 1, top=args.top)
    return train, [r for r in others if r["prompt"][-1]["content"] not in seen][: args.heldout]


def longest_prompt(rows: list[dict]) -> int:
    """The most tokens of a first prompt (with the tools block) among `rows`, as forge_nb renders it."""
    from transformers import AutoTokenizer

    from forge_nb.agents.tool_calls import render
    from forge_nb.agents.tools import ToolSet
    from forge_nb.models import resolve_model

    tokenizer, schemas = AutoTokenizer.from_pretrained(str(resolve_model(MODEL))), ToolSet([calculator]).schemas
    texts = [render(tokenizer, r["prompt"], schemas) for r in rows]
    return max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def forge_nb_run(args: argparse.Namespace, train: list[dict], heldout: list[dict]) -> dict:
    """Evaluate, train for `args.minutes`, evaluate; then time steps without the zero-advantage skip."""
    s = forge_nb.up(
        model=MODEL,
        task={"train": train, "eval": heldout},
        eval_size=len(heldout),
        engine=args.engine,
        prompts_per_step=args.prompts,
        group_size=args.group,
        max_tokens=args.max_tokens,
        max_turns=args.max_turns,
        max_total_tokens=args.longest_prompt + args.max_completion_tokens,
        temperature=args.temperature,
        lr=args.lr,
        loss="grpo",
        threads_per_proc=args.threads,
        seed=args.seed,
    )
    try:
        s.set_rollout(calculator_rollout, tools=[calculator])
        before = s.evaluate()
        print(
            f"forge_nb: held-out accuracy before {before['heldout_accuracy']:.3f} "
            f"(eval reward {before['eval_reward']:.3f}, {before['eval_s']:.0f} s)",
            flush=True,
        )
        rows, deadline = [], time.perf_counter() + args.minutes * 60
        while time.perf_counter() < deadline:
            row = s.step(1, progress=False).iloc[0]
            rows.append(row)
            print(
                f"  step {len(rows):3d}: reward {row.mean_reward:.3f}, {row.turns:.2f} turns/traj, "
                f"{row.tool_calls} tool calls ({row.tool_errors} failed), {row.step_s:.1f} s "
                f"(generate {row.generate_s:.1f}, train {row.train_s:.1f}, refresh {row.refresh_s:.2f})",
                flush=True,
            )
        after = s.evaluate()
        print(
            f"forge_nb: held-out accuracy after {after['heldout_accuracy']:.3f} "
            f"(eval reward {after['eval_reward']:.3f})",
            flush=True,
        )
        timed = rows[args.warmup :] or rows
        train_rows = s.metrics_stream.to_pandas("train").iloc[args.warmup :]
        skipped, trained = train_rows.rows_skipped.sum(), len(train_rows) * args.prompts * args.group
        noskip = []
        if args.noskip_steps:
            s.set_loss(NOSKIP_LOSS)
            noskip = s.step(args.noskip_steps, progress=False).step_s.tolist()
    finally:
        s.down()
    trajectories = args.prompts * args.group
    return {
        "before": before["heldout_accuracy"],
        "after": after["heldout_accuracy"],
        "eval_reward_before": before["eval_reward"],
        "eval_reward_after": after["eval_reward"],
        "steps": len(rows),
        "reward_first": statistics.fmean(r.mean_reward for r in rows[:5]),
        "reward_last": statistics.fmean(r.mean_reward for r in rows[-5:]),
        "step_s": statistics.median(r.step_s for r in timed),
        "generate_s": statistics.median(r.generate_s for r in timed),
        "noskip_step_s": statistics.median(noskip) if noskip else float("nan"),
        "turns": statistics.fmean(r.turns for r in timed),
        "tool_calls": statistics.fmean(r.tool_calls for r in timed) / trajectories,
        "tool_errors": statistics.fmean(r.tool_errors for r in timed) / trajectories,
        "skipped_share": skipped / max(1, trained),
    }


def check_same_prompt(tokenizer, row: dict) -> None:
    """TRL's first prompt (HERMES_CHAT_TEMPLATE, tools=[calculator]) must be forge_nb's, token for token."""
    from forge_nb.agents.tool_calls import render
    from forge_nb.agents.tools import ToolSet

    ours = render(tokenizer, row["prompt"], ToolSet([calculator]).schemas)
    tokenizer.chat_template = HERMES_CHAT_TEMPLATE
    theirs = tokenizer.apply_chat_template(
        row["prompt"], tools=[calculator], tokenize=False, add_generation_prompt=True
    )
    if ours != theirs:
        raise SystemExit(f"TRL's prompt differs from forge_nb's:\n--- forge_nb\n{ours}\n--- TRL\n{theirs}")


def trl_run(args: argparse.Namespace, train: list[dict]) -> dict:
    """TRL's median seconds per step over `args.trl_steps` steps after one warm-up step, and its tool calls."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from forge_nb.models import resolve_model

    counts = {"trajectories": 0, "tool_calls": 0, "turns": 0, "reward": 0.0}

    def reward(completions, answer, **_) -> list[float]:
        scores = []
        for messages, target in zip(completions, answer):
            replies = [m for m in messages if m.get("role") == "assistant"]
            counts["trajectories"] += 1
            counts["turns"] += len(replies)
            counts["tool_calls"] += sum(len(m.get("tool_calls") or []) for m in replies)
            scores.append(answer_reward(replies[-1].get("content") if replies else None, target))
            counts["reward"] += scores[-1]
        if args.show and counts["trajectories"] == len(completions):
            print(f"TRL, a trajectory of the first step: {completions[0]}", flush=True)
        return scores

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_end(self, *_, **__) -> None:
            self.times.append(time.perf_counter())

    path = str(resolve_model(MODEL))
    tokenizer = AutoTokenizer.from_pretrained(path)
    check_same_prompt(tokenizer, train[0])  # sets tokenizer.chat_template = HERMES_CHAT_TEMPLATE
    tokenizer.response_template = qwen3_template  # ChatML + <tool_call> JSON: how TRL parses a reply's tool calls
    config = GRPOConfig(
        output_dir="/tmp/forge_nb_agents_trl",
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=10_000,
        per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group,
        max_completion_length=args.max_completion_tokens,
        generation_kwargs={"max_new_tokens": args.max_tokens},  # per model call, as forge_nb's engine.max_tokens
        max_tool_calling_iterations=args.max_turns - 1,
        temperature=args.temperature,
        top_p=1.0,
        learning_rate=args.lr,
        loss_type="grpo",
        scale_rewards="group",
        beta=0.0,
        epsilon=0.2,
        max_grad_norm=1.0,
        weight_decay=0.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=1 + args.trl_steps,
        seed=args.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        bf16=False,
    )
    times = StepTimes()
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in train]),
        processing_class=tokenizer,
        tools=[calculator],
        callbacks=[times],
    )
    if trainer.chat_template is not None:
        print("TRL replaced the chat template with its training template (not prefix-preserving)", flush=True)
    start = time.perf_counter()
    trainer.train()
    ends = [start, *times.times]
    n = max(1, counts["trajectories"])
    return {
        "step_s": statistics.median(b - a for a, b in zip(ends[1:], ends[2:])),
        "turns": counts["turns"] / n,
        "tool_calls": counts["tool_calls"] / n,
        "reward": counts["reward"] / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="forge_nb training time")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top", type=int, default=40, help="largest number in the problems")
    parser.add_argument("--max-tokens", type=int, default=48, help="new tokens per model call")
    parser.add_argument("--max-turns", type=int, default=3, help="model calls per trajectory")
    parser.add_argument("--max-completion-tokens", type=int, default=192, help="tokens per trajectory after its prompt")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--train", type=int, default=400)
    parser.add_argument("--heldout", type=int, default=50)
    parser.add_argument("--engine", default="torch")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per forge_nb proc (TRL: the same)")
    parser.add_argument("--warmup", type=int, default=1, help="forge_nb steps left out of the timing")
    parser.add_argument("--noskip-steps", type=int, default=2)
    parser.add_argument("--trl-steps", type=int, default=3, help="timed TRL steps (after one warm-up step)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", action="store_true", help="print one TRL trajectory")
    args = parser.parse_args()
    train, heldout = data(args)
    args.longest_prompt = longest_prompt(train + heldout)
    ours = forge_nb_run(args, train, heldout)
    torch.set_num_threads(args.threads)
    trl = trl_run(args, train)
    n = args.prompts * args.group
    print(
        f"\n{MODEL}, calculator tool on word problems ({len(train)} train, {len(heldout)} held out), "
        f"{args.prompts} prompts x {args.group} trajectories per step, <= {args.max_turns} model calls x "
        f"{args.max_tokens} new tokens, <= {args.max_completion_tokens} tokens per trajectory after its prompt, "
        f"GRPO, lr {args.lr:g}, "
        f"float32 CPU, {args.threads} threads per proc, forge_nb {args.engine} engine\n"
    )
    print(
        f"held-out accuracy (greedy, agent): {ours['before']:.3f} -> {ours['after']:.3f} after {ours['steps']} steps "
        f"({args.minutes:g} min); eval reward {ours['eval_reward_before']:.3f} -> {ours['eval_reward_after']:.3f}; "
        f"mean reward first 5 steps {ours['reward_first']:.3f} -> last 5 {ours['reward_last']:.3f}\n"
    )
    table = [
        ("forge_nb, zero-advantage trajectories skipped", ours["step_s"]),
        ("forge_nb, no skip (same work as TRL)", ours["noskip_step_s"]),
        ("TRL GRPOTrainer 1.16.0, tools=[calculator]", trl["step_s"]),
    ]
    print(f"{'':<48}{'s/step':>8}{'traj/s':>9}{'vs TRL':>8}")
    for name, seconds in table:
        print(f"{name:<48}{seconds:>8.2f}{n / seconds:>9.3f}{trl['step_s'] / seconds:>7.2f}x")
    print(
        f"\nforge_nb generation only: {ours['generate_s']:.2f} s/step, {n / ours['generate_s']:.3f} traj/s; "
        f"trajectories skipped by its trainer (zero advantage): {ours['skipped_share']:.0%}"
    )
    print(
        f"per trajectory: forge_nb {ours['turns']:.2f} model calls, {ours['tool_calls']:.2f} tool calls "
        f"({ours['tool_errors']:.2f} failed); TRL {trl['turns']:.2f} model calls, {trl['tool_calls']:.2f} tool calls, "
        f"mean reward {trl['reward']:.3f} (all its steps)"
    )


if __name__ == "__main__":
    main()
