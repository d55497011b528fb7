"""The trainer and generator parts of `make gpu-check` (the package docstring says what each row is)."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from forge_nb.config import AlgorithmConfig, TrainerConfig
from forge_nb.live.builtin import builtin_loss
from forge_nb.live.capture import compile_function
from forge_nb.live.validate import check_loss_value
from forge_nb.parallel.gang import Gang
from forge_nb.parallel.policy import Policy, PolicySpec
from forge_nb.rl.batch import TrainBatch
from forge_nb.tools.gpu_check.table import Row, free, grpo_batch, measure


def grpo_step(policy: Policy, batch: TrainBatch, max_tokens: int):
    """One optimizer step of the GRPO loss (the session's loss v0) -> the callable that runs it -> metrics."""
    loss_fn = compile_function(builtin_loss(AlgorithmConfig(loss="grpo"), max_tokens=max_tokens))
    return lambda: policy.update(batch, loss_fn, 1.0, check_loss_value, False)[0]


def trainer_rows(model_dir: str, args: argparse.Namespace) -> list[Row]:
    """The trainer's step on CUDA under each setting the sharded trainer offers (see the package docstring)."""
    batch = grpo_batch(args.prompts, args.group, args.prompt_len, args.completion_len, args.vocab)
    gang = Gang.join(torch.device(args.device))  # a group of one: FSDP2 at world size 1
    settings = [
        ("plain, fp32", TrainerConfig(), False),
        ("FSDP2 x1, fp32", TrainerConfig(), True),
        ("FSDP2 x1, bf16 mixed precision", TrainerConfig(mixed_precision="bf16"), True),
        ("  the same, without the entropy metric", TrainerConfig(mixed_precision="bf16", entropy=False), True),
        (f"  + micro-batches of {args.micro} tokens", TrainerConfig(args.micro, False, "bf16"), True),
        ("  + activation checkpointing", TrainerConfig(args.micro, True, "bf16"), True),
    ]
    rows, first = [], {}
    for what, trainer, sharded in settings:
        row, first[what], files = _trainer_row(model_dir, args, batch, what, trainer, gang if sharded else Gang())
        rows.extend([row, *files])
    (plain_loss, plain_grad), (loss, grad) = first["plain, fp32"], first["FSDP2 x1, fp32"]
    rows[1].check = f"1st step: loss {loss:.6f} grad {grad:.5f}; plain: {plain_loss:.6f}, {plain_grad:.5f}"
    gang.leave()
    return rows


def _trainer_row(model_dir, args, batch, what, trainer, gang) -> tuple[Row, tuple[float, float], list[Row]]:
    """One setting: load, a first step (its loss and gradient norm), then timed steps -> (row, first step,
    the files rows of the first sharded setting: `_files_rows`)."""
    spec = PolicySpec(model_dir, "float32", args.device, 0, 1.0, trainer, gang.mesh is not None, 1e-6)
    start = time.perf_counter()
    policy = Policy(spec, gang)
    loaded = time.perf_counter() - start
    step = grpo_step(policy, batch, args.completion_len)
    metrics = step()
    seconds, peak = measure(step, args.steps)
    tokens = len(batch.prompt_ids) * (args.prompt_len + args.completion_len)
    check = f"{metrics['micro_batches']} micro-batch(es), entropy {metrics['entropy']:.4f}"
    row = Row("trainer", what, seconds, tokens / seconds, "tok/s", peak, check)
    files = _files_rows(policy, loaded) if what == "FSDP2 x1, fp32" else []
    del policy, step
    free()
    return row, (metrics["loss"], metrics["grad_norm"]), files


def _files_rows(policy: Policy, loaded: float) -> list[Row]:
    """The sharded policy's HF directory in and out by rows (`parallel.sharded_load`, `sharded_save`): its
    load into GPU shards, and its save from them, checked against the trainer's weights."""
    from safetensors.torch import load_file

    gb = sum(p.numel() * p.element_size() for p in policy.model.parameters()) / 1e9
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        policy.save_pretrained(out)
        saved = time.perf_counter() - start
        files = load_file(Path(out) / "model.safetensors")
        same = all(torch.equal(files[n], t.cpu()) for n, t in policy.whole_published())
    return [
        Row("files", "load by rows into GPU shards", loaded, gb / loaded, "GB/s", check=f"by rows: {policy.by_rows}"),
        Row("files", "save by rows from GPU shards", saved, gb / saved, "GB/s", check=f"saved == trainer's: {same}"),
    ]


def generator_rows(model_dir: str, args: argparse.Namespace) -> list[Row]:
    """The torch engine sampling on CUDA, and its logprobs against the trainer's on the same tokens."""
    return [_generator_row(model_dir, args, dtype) for dtype in (torch.float32, torch.bfloat16)]


def _generator_row(model_dir: str, args: argparse.Namespace, dtype: torch.dtype) -> Row:
    from forge_nb.engines.base import SamplingParams
    from forge_nb.engines.torch_engine import TorchEngine

    prompts = grpo_batch(args.prompts, 1, args.prompt_len, 1, args.vocab, seed=1).prompt_ids
    sampling = SamplingParams(n=args.group, temperature=1.0, max_tokens=args.completion_len, seed=0)
    engine = TorchEngine.load(model_dir, dtype, args.device)
    engine.eos_id = -1  # a random model: every sample runs max_tokens long
    out: list = []
    seconds, peak = measure(lambda: out.append(engine.generate(prompts, sampling)), 1)
    completions = [c for per_prompt in out[-1] for c in per_prompt]
    engine = None  # its memory back before the trainer loads
    name = str(dtype).removeprefix("torch.")
    trainer = Policy(PolicySpec(model_dir, name, args.device, 0, 1.0, TrainerConfig(), False), Gang())
    theirs = trainer.logprobs([c.prompt_ids for c in completions], [c.token_ids for c in completions])
    del trainer
    free()
    diffs = [abs(a - b) for c, t in zip(completions, theirs) for a, b in zip(c.logprobs, t)]
    check = f"|logprob - trainer's| max {max(diffs):.2e}, mean {statistics.fmean(diffs):.2e} ({len(diffs)} tokens)"
    sampled = sum(len(c.token_ids) for c in completions)
    return Row("generator", f"torch engine, {name}", seconds, sampled / seconds, "tok/s", peak, check)
