"""What a session's clients may ask of it: the `Session` API as calls, with the batches kept here (clients hold
handles), the metrics stream read from any row on, and one exclusive command at a time.

An exclusive command (a step, a rollout, a train, an evaluation, a save) runs for one client at a time; another
client's waits, after being told who holds the session (`Busy`). While a background run is running, a client's
step, rollout or train is refused with the name of whoever started the run: its steps would interleave with the
run's. Live-code swaps, syncs, status, tables and the metrics need no turn (the session's own locks put swaps
between batches).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cloudpickle
import pandas as pd

from forge_nb.loop import AsyncRun, BackgroundRun
from forge_nb.rl.rollout import Rollout
from forge_nb.server.protocol import RolloutView, RunView
from forge_nb.session import Session
from forge_nb.state import SessionError

#: Commands that run for one client at a time.
EXCLUSIVE = frozenset({"step", "rollout", "train", "sync_step", "evaluate", "save", "save_checkpoint", "export"})
#: Commands refused while a background run is running (they would train between its steps).
NOT_DURING_A_RUN = frozenset({"step", "rollout", "train", "sync_step"})
KEPT_ROLLOUTS = 16  # batches a client may still `train` on: the latest ones


class Busy(Exception):
    """An exclusive command runs for another client: `holder` says which, and what."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


class SessionService:
    """The calls a client can make on `session`; `who` is the calling client's description."""

    def __init__(self, session: Session, name: str) -> None:
        self.session, self.name = session, name
        self.rollouts: OrderedDict[int, Rollout] = OrderedDict()
        self._next_handle = 1
        self._command = threading.Lock()
        self.holder: str | None = None
        self.run_started_by = ""
        self.trajectories: dict[str, tuple[Any, Any]] = {}
        self.clients: Callable[[], list[str]] = list  # who is attached (the server sets it)
        self._rows = threading.Condition()
        session.metrics_stream.subscribe(self._on_row)

    # -- dispatch ------------------------------------------------------------------------------------------
    def call(self, who: str, method: str, args: tuple, kwargs: dict, wait: bool) -> Any:
        """Run `method` for client `who` -> its result. `Busy` when it is exclusive, another client's runs and
        `wait` is false; `SessionError` for a step while a background run runs."""
        handler = getattr(self, f"remote_{method}", None)
        if handler is None:
            raise SessionError(f"forge_nb: the session server has no call {method!r}")
        if method not in EXCLUSIVE:
            return handler(who, *args, **kwargs)
        with self._turn(who, method, wait):
            if method in NOT_DURING_A_RUN:
                self._no_running_run(method)
            return handler(who, *args, **kwargs)

    @contextmanager
    def _turn(self, who: str, method: str, wait: bool) -> Iterator[None]:
        if not self._command.acquire(blocking=False):
            if not wait:
                raise Busy(self.holder or "another client")
            self._command.acquire()
        self.holder = f"{method} for {who}"
        try:
            yield
        finally:
            self.holder = None
            self._command.release()

    def finish_commands(self, timeout: float) -> bool:
        """Before `down`: a `step(n)` in flight stops at its next step boundary, and the command in flight (a
        save, a step) is waited for up to `timeout` s -> whether it ended (then no other starts: the lock is kept,
        as the service is going down)."""
        self.session.interrupt_steps()
        return self._command.acquire(timeout=timeout)

    def _no_running_run(self, method: str) -> None:
        run = self.session.background
        if run is not None and run.state == "running":
            raise SessionError(
                f"forge_nb: {method} refused: a background run started by {self.run_started_by} is running "
                "(its steps and yours would interleave); pause or stop it first (%forge pause, s.pause())"
            )

    # -- the step ------------------------------------------------------------------------------------------
    def remote_rollout(self, who: str, problems: list | None = None) -> RolloutView:
        batch = self.session.rollout(problems)
        handle = self._next_handle
        self._next_handle += 1
        self.rollouts[handle] = batch
        while len(self.rollouts) > KEPT_ROLLOUTS:
            self.rollouts.popitem(last=False)
        return self._view(handle, batch)

    def remote_train(self, who: str, handle: int) -> dict[str, Any]:
        return self.session.train(self._batch(handle))

    def remote_sync(self, who: str) -> dict[str, Any]:
        return self.session.sync()

    def remote_sync_step(self, who: str) -> Any:
        return self.session.sync_step()

    def remote_step(self, who: str, n: int = 1) -> pd.DataFrame:
        return self.session.step(n, progress=False)

    def remote_interrupt(self, who: str) -> None:
        """A client's cell was interrupted: its `step(n)` stops at the next step boundary (not exclusive: it is
        called while the step holds the session)."""
        self.session.interrupt_steps()

    def remote_rollout_table(self, who: str, handle: int) -> pd.DataFrame:
        return self._batch(handle).to_pandas()

    def remote_rollout_episodes(self, who: str, handle: int) -> list:
        return self._batch(handle).episodes

    def _batch(self, handle: int) -> Rollout:
        try:
            return self.rollouts[handle]
        except KeyError:
            raise SessionError(
                f"forge_nb: rollout #{handle} is no longer kept by the session (it keeps the last {KEPT_ROLLOUTS}); "
                "make a new one with s.rollout()"
            ) from None

    def _view(self, handle: int, batch: Rollout) -> RolloutView:
        return RolloutView(
            handle,
            self.name,
            batch.policy_version,
            batch.accuracy,
            batch.mean_reward,
            batch.tokens_per_s,
            batch.truncated,
            batch.generate_s,
            batch.score_s,
            batch.reference_s,
            len(batch.episodes),
            batch.num_tokens,
            batch.summary(),
        )

    # -- background runs -----------------------------------------------------------------------------------
    def remote_run(self, who: str, steps: int | None = None, mode: str = "sync", max_staleness: int = 1) -> RunView:
        run = self.session.run(steps, mode, max_staleness)
        self.run_started_by = who
        return self._run_view(run)

    def remote_background(self, who: str) -> RunView | None:
        run = self.session.background
        return None if run is None else self._run_view(run)

    def remote_wait_run(self, who: str, timeout: float | None = None) -> RunView | None:
        run = self.session.background
        if run is not None:
            run.wait(timeout)
        return self.remote_background(who)

    def remote_pause(self, who: str) -> None:
        self.session.pause()

    def remote_resume(self, who: str) -> None:
        self.session.resume()

    def remote_stop(self, who: str) -> None:
        self.session.stop()

    def _run_view(self, run: BackgroundRun | AsyncRun) -> RunView:
        extra = {}
        if isinstance(run, AsyncRun):
            extra = {
                "produced": run.produced,
                "trained": run.trained,
                "dropped": run.dropped,
                "unconsumed": len(run.unconsumed),
                "staleness": dict(run.staleness),
            }
        mode = "async" if isinstance(run, AsyncRun) else "sync"
        return RunView(run.state, mode, run.done, run.steps, run.error, self.run_started_by, **extra)

    # -- live code (captured in the client: these get `LiveCode`, or source, or a version) ------------------
    def remote_set_reward(self, who: str, code: Any = None, **options: Any) -> int:
        return self.session.set_reward(code, **options)

    def remote_remove_reward(self, who: str, name: str) -> int:
        return self.session.remove_reward(name)

    def remote_set_loss(self, who: str, code: Any = None, **options: Any) -> int:
        return self.session.set_loss(code, **options)

    def remote_set_rollout(self, who: str, code: Any = None, tools: tuple = (), version: int | None = None) -> int:
        return self.session.set_rollout(code, tools=tools, version=version)

    def remote_set_env(self, who: str, code: Any = None, version: int | None = None) -> int:
        return self.session.set_env(code, version=version)

    def remote_versions(self, who: str, kind: str | None = None) -> pd.DataFrame:
        return self.session.versions(kind)

    def remote_registry(self, who: str) -> Any:
        return self.session.registry

    def remote_rescore(self, who: str, reward: Any, n: int = 256) -> pd.DataFrame:
        return self.session.rescore(reward, n)

    # -- inspection ------------------------------------------------------------------------------------------
    def remote_status(self, who: str) -> dict[str, Any]:
        """`Session.status()`, with the session's name and the clients attached now."""
        return {**self.session.status(), "session": self.name, "clients": self.clients()}

    def remote_facts(self, who: str) -> dict[str, Any]:
        """What a client keeps of the session: its config, run directory, tokenizer's folder, counters."""
        s = self.session
        return {
            "config": s.config,
            "run_id": s.run_id,
            "run_dir": str(s.run_dir),
            "model_dir": str(s.config.model.resolved_path()),
            "engine": s.engine_name,
            "is_up": s.is_up,
            "step_count": s.step_count,
            "trainer_version": s.trainer_version,
            "generator_version": s.generator_version,
            "pids": s.pids,
        }

    def remote_samples(self, who: str, n: int = 16, step: int | None = None, prompt_id: str | None = None):
        return self.session.samples(n, step=step, prompt_id=prompt_id)

    def remote_staleness(self, who: str) -> pd.Series:
        return self.session.staleness()

    def remote_metrics(self, who: str, kind: str | None = None) -> pd.DataFrame:
        return self.session.metrics_stream.to_pandas(kind)

    def remote_rows_since(self, who: str, first: int, timeout: float = 1.0) -> list[dict[str, Any]]:
        """Metrics rows from index `first` on: at once if there are any, else when one arrives or after `timeout`
        seconds (a client's mirror of the stream long-polls this)."""
        stream = self.session.metrics_stream
        with self._rows:
            if len(stream) <= first:
                self._rows.wait(timeout)
        return stream.since(first)

    def _on_row(self, row: dict[str, Any]) -> None:
        with self._rows:
            self._rows.notify_all()

    def remote_checksums(self, who: str, *roles: str) -> dict[str, Any]:
        return self.session.checksums(*roles)

    def remote_evaluate(self, who: str, max_tokens: int | None = None, greedy: bool | None = None) -> dict:
        return self.session.evaluate(max_tokens, greedy)

    def remote_prompt(self, who: str, i: int = 0) -> str:
        return self.session.prompt(i)

    def remote_generate(self, who: str, prompt: Any, n: int = 1, temperature=None, max_tokens=None) -> list[str]:
        return self.session.generate(prompt, n, temperature, max_tokens)

    # -- watches (the predicate travels pickled by value: it runs here, at step boundaries) ---------------
    def remote_watch(self, who: str, thresholds: dict[str, float], when: bytes | None, baseline_steps: int) -> dict:
        predicate: Callable[[dict], bool] | None = cloudpickle.loads(when) if when is not None else None
        watch = self.session.watch(predicate, baseline_steps, **thresholds)
        return {"thresholds": watch.thresholds, "when": predicate is not None}

    def remote_unwatch(self, who: str) -> None:
        self.session.unwatch()

    def remote_watch_fired(self, who: str) -> list:
        watcher = self.session.watcher
        return list(watcher.fired) if watcher is not None else []

    # -- checkpoints, export ----------------------------------------------------------------------------------
    def remote_save(self, who: str, path: str) -> Path:
        return self.session.save(path)

    def remote_save_checkpoint(self, who: str, path: str) -> int:
        return self.session.save_checkpoint(path)

    def remote_export(self, who: str, path: str, steps: int = 100) -> Path:
        return self.session.export(path, steps)

    def remote_checkpoint_before(self, who: str, step: int) -> Path:
        """The newest checkpoint at or before `step` (for `fork`: a new session from it)."""
        found = self.session.checkpoints.newest(at_or_before=step)
        if found is None:
            steps = self.session.checkpoints.steps()
            raise SessionError(f"forge_nb: no checkpoint at or before step {step} (checkpoints at steps {steps})")
        return found

    def last_checkpoint(self) -> str | None:
        """The newest checkpoint of the session that still exists (saved, or periodic), for `forge-nb ps`."""
        found = self.session.checkpoints.newest()
        return str(found) if found is not None else None

    # -- agents outside the mesh ---------------------------------------------------------------------------
    def remote_endpoint(self, who: str, host: str = "127.0.0.1") -> dict[str, str]:
        endpoint = self.session.endpoint(host)
        return {"url": endpoint.url, "api_key": endpoint.api_key}

    def remote_serve_tinker(self, who: str, host: str = "127.0.0.1", port: int = 0) -> dict[str, str]:
        endpoint = self.session.serve_tinker(host, port)
        return {"url": endpoint.url, "api_key": endpoint.api_key}

    def remote_open_trajectory(self, who: str, row: dict) -> dict[str, str]:
        manager = self.session.trajectory(row)
        opened = manager.__enter__()
        self.trajectories[opened.id] = (manager, opened)
        return {"id": opened.id, "base_url": opened.base_url, "api_key": opened.api_key}

    def remote_close_trajectory(self, who: str, tid: str, reward: float | None, error: str | None) -> None:
        manager, opened = self.trajectories.pop(tid)
        if reward is not None:
            opened.reward(reward)
        if error is None:
            manager.__exit__(None, None, None)
            return
        failed = RuntimeError(error)
        try:
            manager.__exit__(RuntimeError, failed, None)
        except RuntimeError as e:
            if e is not failed:
                raise
