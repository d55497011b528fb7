"""What `Session.status()` shows: the mesh, the actors, the versions, the background run, what went wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from forge_nb.live.manager import LiveCodeManager
from forge_nb.loop import RunSlot
from forge_nb.mesh.roles import Roles
from forge_nb.state import RunState


def session_status(
    st: RunState, actors: Roles | None, live_code: LiveCodeManager, runs: RunSlot, run_dir: Path
) -> dict[str, Any]:
    """Mesh, actors and versions, the background run, recent events and errors, as a dict."""
    if actors is None:
        return {"up": False, "steps": st.step_count}
    run = runs.current
    return {
        "up": True,
        **actors.describe(),
        "steps": st.step_count,
        "policy_version": {"trainer": st.versions.trained, "generator": st.versions.served},
        "samples": st.buffer.added,
        "reward_version": live_code.live("reward").version,
        "loss_version": live_code.live("loss").version,
        "run": None if run is None else {"state": run.state, "steps_done": run.done, "error": run.error},
        "events": [{k: r[k] for k in ("time", "role", "what")} for r in st.metrics.rows("event")[-5:]],
        "reward_errors": len(st.reward_errors),
        "last_reward_errors": st.reward_errors[-3:],
        "model": str(st.config.model.resolved_path()),
        "run_dir": str(run_dir),
        "log_errors": [e for e in [st.rollout_log and st.rollout_log.error, *st.trackers.errors] if e],
    }
