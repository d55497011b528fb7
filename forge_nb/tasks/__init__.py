"""Tasks: prompt streams with verifiers. `make_task(config, seed, data)` builds a bundled task by name,
or a `DatasetTask` from your data."""

from __future__ import annotations

from typing import Any

from forge_nb.config import TaskConfig
from forge_nb.tasks.arithmetic import Addition
from forge_nb.tasks.base import Messages, Problem, Task

TASKS = {"addition": Addition}


def make_task(config: TaskConfig, seed: int, data: Any = None) -> Task:
    """The task `config` (a `TaskConfig`) names; with ``name="dataset"``, from `data` or `config.path`."""
    if config.name == "dataset":
        from forge_nb.tasks.dataset import DatasetTask

        return DatasetTask.load(data, config, seed)
    if config.name not in TASKS:
        raise ValueError(f"task.name: unknown task {config.name!r}; bundled tasks: {sorted(TASKS)}, or 'dataset'")
    if data is not None:
        raise ValueError(f"task.name={config.name!r} is a bundled task; data is for task.name='dataset'")
    return TASKS[config.name](seed=seed, max_digits=config.max_digits, eval_size=config.eval_size)


__all__ = ["Addition", "Messages", "Problem", "Task", "TASKS", "make_task"]
