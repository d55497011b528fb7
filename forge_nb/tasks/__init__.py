"""Tasks: prompt streams with exact verifiers. `make_task(name, **options)` builds a bundled one."""

from __future__ import annotations

from forge_nb.tasks.arithmetic import Addition
from forge_nb.tasks.base import Problem, Task

TASKS = {"addition": Addition}


def make_task(name: str, seed: int, **options: object) -> Task:
    """A bundled task by name; `options` are its dataclass fields (e.g. ``max_digits=3``)."""
    if name not in TASKS:
        raise ValueError(f"task.name: unknown task {name!r}; bundled tasks: {sorted(TASKS)}")
    return TASKS[name](seed=seed, **options)


__all__ = ["Addition", "Problem", "Task", "TASKS", "make_task"]
