"""Tinker's checkpoints, in the session's run directory: ``run_dir/tinker/<model id>/<weights|sampler_weights>/
<name>``, named by the SDK as ``tinker://<model id>/<weights|sampler_weights>/<name>``. A training checkpoint
(save_weights) is the trainer's state (`Trainer.save_state`: weights and optimizer, resumable at any number of
ranks); a sampler checkpoint (save_weights_for_sampler with a name) the weights alone (with LoRA, peft's
adapter). Each has a ``tinker.json``: its type, time, base model, LoRA rank, policy version, user metadata.
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tinker import types

from forge_nb.server.tinker.wire import BadRequest

SEGMENT = {"training": "weights", "sampler": "sampler_weights"}
META = "tinker.json"


class NotFound(LookupError):
    """What the API answers with 404 (the SDK does not retry it)."""


class CheckpointStore:
    """The checkpoints under `root` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def new(self, model_id: str, kind: str, name: str | None, overwrite: bool = True) -> tuple[str, Path]:
        """Where checkpoint `name` of `kind` ("training" or "sampler") of `model_id` goes -> (its tinker path,
        its folder, emptied). `BadRequest` for a name that is not one path segment (`check_name`), or one taken
        (unless `overwrite`)."""
        self.check_name(name)
        folder = self.root / model_id / SEGMENT[kind] / name
        if folder.exists():
            if not overwrite:
                raise BadRequest(f"path: checkpoint {name!r} exists (overwrite=true replaces it)")
            shutil.rmtree(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        return f"tinker://{model_id}/{SEGMENT[kind]}/{name}", folder

    @staticmethod
    def check_name(name: str | None) -> None:
        """`BadRequest` unless `name` is one path segment (no '/', not hidden)."""
        if not name or "/" in name or name.startswith("."):
            raise BadRequest(f"path: {name!r} is not a checkpoint name (one path segment, no '/')")

    def write_meta(self, folder: Path, kind: str, **meta: Any) -> None:
        (folder / META).write_text(json.dumps({"checkpoint_type": kind, "time": time.time(), **meta}))

    def find(self, tinker_path: str, kind: str | None = None) -> tuple[Path, dict[str, Any]]:
        """The folder and metadata of the checkpoint `tinker_path` names; `BadRequest` for a path that is not
        one, `NotFound` for one this session does not have."""
        try:
            parsed = types.ParsedCheckpointTinkerPath.from_tinker_path(tinker_path)
        except ValueError:
            shape = "tinker://<run>/<weights|sampler_weights>/<name>"
            raise BadRequest(f"path: {tinker_path!r} is not a {shape} path") from None
        if parsed.training_run_id in ("", ".", ".."):
            raise BadRequest(f"path: {tinker_path!r} names no training run")
        if kind is not None and parsed.checkpoint_type != kind:
            raise BadRequest(f"path: {tinker_path!r} is a {parsed.checkpoint_type} checkpoint; a {kind} one is needed")
        folder = self.root / parsed.training_run_id / parsed.checkpoint_id
        if not (folder / META).is_file():
            raise NotFound(f"no checkpoint {tinker_path!r} in this forge_nb session (its checkpoints: {self.root})")
        return folder, json.loads((folder / META).read_text())

    def listed(self, model_id: str | None = None) -> list[types.Checkpoint]:
        """Every checkpoint (of `model_id`), oldest first."""
        out = []
        for meta_file in sorted(self.root.glob(f"{model_id or '*'}/*/*/{META}")):
            folder = meta_file.parent
            meta = json.loads(meta_file.read_text())
            run, segment, name = folder.parent.parent.name, folder.parent.name, folder.name
            out.append(
                types.Checkpoint(
                    checkpoint_id=f"{segment}/{name}",
                    checkpoint_type=meta["checkpoint_type"],
                    time=datetime.fromtimestamp(meta["time"], UTC),
                    tinker_path=f"tinker://{run}/{segment}/{name}",
                    size_bytes=sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
                    user_metadata=meta.get("user_metadata"),
                )
            )
        return sorted(out, key=lambda c: c.time)

    def delete(self, model_id: str, checkpoint_id: str) -> None:
        folder = self.root / model_id / checkpoint_id
        if ".." in Path(checkpoint_id).parts or not (folder / META).is_file():
            raise NotFound(f"no checkpoint {checkpoint_id!r} of {model_id!r}")
        shutil.rmtree(folder)
