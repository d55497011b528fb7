"""What `Session.status()` shows: the mesh, the actors, the versions, the background run, what went wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from forge_nb.fleet.fleet import Fleet
from forge_nb.live.manager import LiveCodeManager
from forge_nb.loop import RunSlot
from forge_nb.paths import model_label
from forge_nb.state import RunState


def session_status(
    st: RunState, fleet: Fleet | None, live_code: LiveCodeManager, runs: RunSlot, run_dir: Path
) -> dict[str, Any]:
    """Mesh, actors and versions, the background run, recent events and errors, as a dict."""
    if fleet is None:
        return {"up": False, "steps": st.step_count}
    run = runs.current
    return {
        "up": True,
        **fleet.describe(),
        "steps": st.step_count,
        "policy_version": {"trainer": st.versions.trained, "generator": st.versions.served},
        "samples": st.buffer.added,
        "reward_version": live_code.live("reward").version,
        "loss_version": live_code.live("loss").version,
        "run": None if run is None else {"state": run.state, "steps_done": run.done, "error": run.error},
        "events": [{k: r[k] for k in ("time", "role", "what")} for r in st.metrics.rows("event")[-5:]],
        "reward_errors": len(st.reward_errors),
        "last_reward_errors": st.reward_errors[-3:],
        "model": model_label(st.config.model.path),  # a name, or the folder as typed (no machine paths)
        "trainer": trainer_sizes(fleet),
        "run_dir": str(run_dir),
        "log_errors": [e for e in [st.rollout_log and st.rollout_log.error, *st.trackers.errors] if e],
    }


SIZES = ("lora", "trainable_params", "total_params", "adapter_bytes", "refresh_bytes", "loaded")


def trainer_sizes(fleet: Fleet | None) -> dict[str, Any]:
    """What the trainer trains and ships: whether it is a LoRA adapter, trainable and total parameters,
    the adapter's bytes (0 without LoRA), the bytes one refresh moves (`Trainer.sizes`), and how it loaded
    the model (`Policy.loaded`: "by rows", "whole", or "whole: <why>" for a gang that could not read its rows);
    {} when down."""
    infos = fleet.info.get("trainer") or [] if fleet is not None else []
    details = infos[0].details if infos else {}
    sizes = {k: details[k] for k in SIZES if k in details}
    if "refresh_bytes" in sizes:  # a gang's ranks each publish their shards: a refresh moves them all
        sizes["refresh_bytes"] = sum(i.details.get("refresh_bytes", 0) for i in infos)
    return sizes


def sizes_line(sizes: dict[str, Any]) -> str:
    """One line for the dashboard: "LoRA: 1.84M of 136M params trained (1.4%), adapter 7.4 MB, refresh 7.4 MB"."""
    if "trainable_params" not in sizes:
        return ""
    trained, total = sizes["trainable_params"], sizes["total_params"]
    what = "LoRA" if sizes.get("lora") else "full"
    line = f"{what}: {trained / 1e6:.3g}M of {total / 1e6:.3g}M params trained ({100 * trained / total:.3g}%)"
    if sizes.get("lora"):
        line += f", adapter {sizes['adapter_bytes'] / 1e6:.3g} MB"
    return f"{line}, refresh {sizes['refresh_bytes'] / 1e6:.3g} MB"
