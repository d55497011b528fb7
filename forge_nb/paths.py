"""Paths as a user would type them, for what forge_nb prints (status, hints): a notebook's stored output then
says ``runs/exp1`` or ``~/models/x``, not the folders of the machine that ran it."""

from __future__ import annotations

from pathlib import Path


def as_typed(path: str | Path) -> Path:
    """`path` relative to the current folder when it is inside it, else under ``~`` when it is in the home
    folder, else as it is (absolute)."""
    path = Path(path).expanduser().resolve()
    for base, shown in ((Path.cwd().resolve(), Path()), (Path.home().resolve(), Path("~"))):
        if base != Path(base.anchor) and path.is_relative_to(base):
            return shown / path.relative_to(base)
    return path


def model_label(path_or_name: str) -> str:
    """A model as configured: a registry name (``bundled``, ``smollm2-135m-instruct``) as it is, a folder
    as typed (`as_typed`)."""
    return str(as_typed(path_or_name)) if Path(path_or_name).expanduser().exists() else path_or_name
