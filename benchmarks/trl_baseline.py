"""The TRL side of the benchmarks against TRL's GRPOTrainer (vs_trl.py, real_model.py, agents.py): one GRPOConfig
for the same work as forge_nb's GRPO, a clock of its optimizer steps, and the loss forge_nb runs for its no-skip
rows. Needs `make bench-deps` (trl==1.16.0).

Same work on both sides: P prompts x G samples per optimizer step, temperature 1 (`temperature`), top-p 1, the GRPO
loss (ratio clip 0.2, group-normalised advantages, no KL), AdamW at a constant learning rate without weight decay,
grad-norm clip 1.0, float32 on the CPU unless `bf16` (TRL's default, autocast on the CPU too) and no gradient
checkpointing (TRL's default recomputes activations in backward and turns generation's KV cache off: more work).
"""

from __future__ import annotations

import statistics
import time

# forge_nb's trainer leaves zero-advantage rows out of its forward/backward; a live loss is never skipped, so the
# same GRPO loss given as one times forge_nb doing exactly TRL's work.
NOSKIP_LOSS = """
from forge_nb.rl.losses import grpo_loss


def loss(logprobs, old_logprobs, advantages, mask):
    return grpo_loss(logprobs, old_logprobs, advantages, mask, clip_eps=0.2)
"""


def grpo_config(
    output_dir: str,
    samples: int,
    group: int,
    max_completion_length: int,
    lr: float,
    max_steps: int,
    seed: int = 0,
    temperature: float = 1.0,
    bf16: bool = False,
):
    """A GRPOConfig of `samples` (P x G) per optimizer step, `group` (G) samples per prompt, `max_steps` steps."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=10_000,
        per_device_train_batch_size=samples,
        num_generations=group,
        max_completion_length=max_completion_length,
        temperature=temperature,
        top_p=1.0,
        learning_rate=lr,
        loss_type="grpo",
        scale_rewards="group",
        beta=0.0,
        epsilon=0.2,
        max_grad_norm=1.0,
        weight_decay=0.0,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_steps=max_steps,
        seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        bf16=bf16,
        gradient_checkpointing=False,
    )


def step_clock():
    """A TrainerCallback whose `times` gets `time.perf_counter()` at the end of every optimizer step."""
    from transformers import TrainerCallback

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_end(self, *_, **__) -> None:
            self.times.append(time.perf_counter())

    return StepTimes()


def median_step_s(start: float, times: list[float]) -> float:
    """Median seconds per step of the steps after the first (a warm-up), from `train()`'s `start` and the
    step ends of `step_clock()`."""
    ends = [start, *times]
    return statistics.median(b - a for a, b in zip(ends[1:], ends[2:]))
