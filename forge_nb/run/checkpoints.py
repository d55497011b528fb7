"""A session's checkpoints: written on request or every `checkpoint.every` steps, read back, found by step.

What goes in one (`run.checkpoint_files` writes and reads the files): the trainer's weights and optimizer
state (and the generator's served weights when they differ), the run's counters and policy
versions, the task stream's position, the replay buffer, every reward and loss version and the
metrics. The session holds both sides' locks while one is written, so it falls between batches.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forge_nb.config import Config
from forge_nb.fleet.fleet import Fleet, StartFrom
from forge_nb.fleet.recovery import CheckpointLost
from forge_nb.live.registry import Registry
from forge_nb.metrics import MetricsStream
from forge_nb.rl.replay import ReplayBuffer
from forge_nb.run import checkpoint_files as checkpoint
from forge_nb.state import RunState


class Checkpoints:
    """Where this session's checkpoints go (`folder`: `checkpoint.dir`, else the run directory's
    checkpoints/), which ones it wrote (`saved`: (step, path)), and when the next periodic one is due."""

    def __init__(self, config: Config, run_dir: Path) -> None:
        c = config.checkpoint
        self.folder = Path(c.dir) if c.dir else run_dir / "checkpoints"
        self.every, self.keep = c.every, c.keep
        self.saved: list[tuple[int, Path]] = []
        self.next_due = c.every

    def save(self, path: str | Path, state: RunState, fleet: Fleet, registry: Registry, tokenizer: Any) -> Path:
        """Write a checkpoint of the run at `path` -> its folder (the caller holds both sides)."""
        versions = state.versions
        counters = {
            "step_count": state.step_count,
            "rollout_count": state.rollout_count,
            "next_sample_id": state.next_sample_id,
            "next_eval": state.next_eval,
            "next_checkpoint": self.next_due,
            "trainer_version": versions.trained,
            "generator_version": versions.served,
            "reward_version": registry.live("reward").version,
            "loss_version": registry.live("loss").version,
            "reward_errors": state.reward_errors,
            "task": state.task.state(),
        }
        rows = getattr(state.task, "rows", None)
        data = {"train": rows("train"), "eval": rows("eval")} if rows and not state.config.task.path else None

        def weights(folder: Path) -> None:
            fleet.save_weights(folder, generator_too=versions.lag != 0)
            for sub in ("trainer", "generator"):
                if (folder / sub).is_dir():
                    tokenizer.save_pretrained(folder / sub)
                    _copy_configs(folder / "trainer", folder / sub)

        buffer = state.buffer
        out = checkpoint.write(
            path,
            counters,
            state.config.to_dict(),
            data,
            registry.to_records(),
            buffer.recent(buffer.added),
            buffer.sample_ids(),
            state.metrics.rows(),
            weights,
        )
        self.saved.append((state.step_count, out))
        return out

    @staticmethod
    def save_model(path: str | Path, fleet: Fleet, tokenizer: Any) -> int:
        """The trainer's current weights and the tokenizer as an HF model directory -> their policy version.
        With LoRA: the adapter in peft's format, and the merged model in path/merged (`Trainer.save`)."""
        version = fleet.save(str(path))
        for folder in (Path(path), Path(path) / "merged"):
            if folder.is_dir():
                tokenizer.save_pretrained(str(folder))
        return version

    def due(self, step: int) -> bool:
        """Whether a periodic checkpoint is due after trained step `step` (and schedule the next)."""
        if not self.every or step < self.next_due:
            return False
        self.next_due = (step // self.every + 1) * self.every
        return True

    def periodic(self, step: int, save: Callable[[Path], Path], event: Callable[[str, str], None]) -> None:
        """The checkpoint `checkpoint.every` asks for after `step`, then the oldest pruned. If the trainer
        dies while writing it, the trainer is restored (its own event says from where) and the run goes on
        without this one."""
        try:
            save(self.periodic_path(step))
        except CheckpointLost as e:
            event("checkpoint", f"the checkpoint of step {step} was not written: {e}")
            return
        self.prune()

    def prune(self) -> None:
        """Delete the oldest periodic checkpoints beyond `checkpoint.keep`."""
        checkpoint.prune(self.folder, self.keep)
        self.saved = [(step, p) for step, p in self.saved if p.is_dir()]

    def periodic_path(self, step: int) -> Path:
        return self.folder / checkpoint.PERIODIC.format(step=step)

    def newest(self, at_or_before: int | None = None) -> Path | None:
        """The newest checkpoint that still exists -- saved by this session, or periodic in `folder` --
        at or before step `at_or_before` if given."""
        return checkpoint.newest([*self.saved, *checkpoint.periodic(self.folder)], at_or_before)

    def steps(self) -> list[int]:
        """The steps of every checkpoint `newest` can find."""
        return sorted({n for n, p in [*self.saved, *checkpoint.periodic(self.folder)] if p.is_dir()})

    def load(self, ckpt: checkpoint.Checkpoint, state: RunState) -> tuple[StartFrom, Registry]:
        """Put a checkpoint's kernel-side state in `state` -> where the actors start from, and the
        registry of live code to go on with."""
        st = ckpt.state
        state.step_count, state.rollout_count = st["step_count"], st["rollout_count"]
        state.next_sample_id, state.next_eval = st["next_sample_id"], st["next_eval"]
        self.next_due = st["next_checkpoint"]
        state.versions.trained, state.versions.served = st["trainer_version"], st["generator_version"]
        state.reward_errors = st["reward_errors"]
        state.task.load_state(st["task"])
        state.buffer = ReplayBuffer.restored(ckpt.episodes, ckpt.sample_ids)
        state.metrics = MetricsStream(ckpt.metrics)
        start = StartFrom(str(ckpt.trainer_dir), str(ckpt.generator_dir), st["loss_version"], st["reward_version"])
        return start, Registry.from_records(ckpt.live)


def _copy_configs(source: Path, folder: Path) -> None:
    """The model's config files beside weights saved without them (the generator's served weights)."""
    for name in ("config.json", "generation_config.json"):
        if (source / name).is_file() and not (folder / name).is_file():
            shutil.copyfile(source / name, folder / name)
