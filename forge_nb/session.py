"""Session: the kernel-held controller of one RL post-training run on a Monarch mesh.

It reads like the training loop it drives::

    s = Session.up()            # generator, trainer and reward actors in their own procs
    r = s.rollout()             # generate P x G samples, score them, group-relative advantages
    m = s.train(r)              # one GRPO step on the trainer; policy version v -> v + 1
    w = s.sync()                # generator pulls v + 1 (/dev/shm on this host, Monarch RDMA across hosts)
    s.down()                    # every proc stopped

The state of a run and the step itself are in `core.SessionCore`; the actor calls in `mesh.roles`, the
pure steps between them in `rl.rollout`, the background runs in `loop`, and every reward / loss
version in `live.manager`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from forge_nb.config import Config
from forge_nb.core import SessionCore, SessionError
from forge_nb.export import export_bundle
from forge_nb.live.capture import LiveCode
from forge_nb.live.manager import KINDS
from forge_nb.live.registry import Registry
from forge_nb.loop import AsyncRun, BackgroundRun
from forge_nb.run import checkpoint
from forge_nb.tasks.data import take_task_data
from forge_nb.tasks.dataset import ROW_ANSWER, ROW_ID, ROW_PROMPT
from forge_nb.watch import Watch

__all__ = ["Session", "SessionError"]


class Session(SessionCore):
    """What a notebook, a script or the CLI holds: `SessionCore` (the mesh, the loop, the state of a run)
    plus background runs, live code, evaluation, inspection and export."""

    @classmethod
    def up(cls, config: Config | None = None, **overrides: Any) -> Session:
        """Validate the config and the data, start every actor and wait until each one is ready.
        ``task=`` takes a bundled task's name, rows (list of dicts, DataFrame, Dataset) or a file."""
        overrides, data = take_task_data(overrides)
        session = cls((config or Config()).updated(overrides), data)
        session._start()
        return session

    @classmethod
    def restore(cls, path: str | Path, **overrides: Any) -> Session:
        """A session that goes on exactly where the checkpoint at `path` was (`save`, or a periodic one):
        its own mesh, the same weights, optimizer state, counters, task position, buffer, live code and
        metrics. `overrides` change config fields (e.g. ``lr=1e-5``, ``engine="vllm"``)."""
        ckpt = checkpoint.read(path)
        values = ckpt.config
        if ckpt.data is not None:  # the rows were written under the names of `DatasetTask.rows`
            values = {
                **values,
                "task": {
                    **values["task"],
                    "prompt_column": ROW_PROMPT,
                    "answer_column": ROW_ANSWER,
                    "id_column": ROW_ID,
                },
            }
        session = cls(Config.from_dict(values).updated(overrides), ckpt.data)
        session._start(session._load(ckpt))
        return session

    def fork(self, step: int) -> Session:
        """A new session, in this kernel beside this one, from the newest checkpoint at or before `step`
        (those this session saved, and the periodic ones in `checkpoint_dir`)."""
        found = [
            (n, p) for n, p in [*self.saved, *checkpoint.periodic(self.checkpoint_dir)] if n <= step and p.is_dir()
        ]
        if not found:
            known = sorted({n for n, _ in [*self.saved, *checkpoint.periodic(self.checkpoint_dir)]})
            raise SessionError(
                f"forge_nb: no checkpoint at or before step {step} (checkpoints at steps {known}); "
                "save one with s.save(path), or set checkpoint.every"
            )
        return Session.restore(max(found, key=lambda f: f[0])[1])

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    @property
    def background(self) -> BackgroundRun | AsyncRun | None:
        """The latest background run (its `state`, `done` steps and `error`), if any."""
        return self.runs.current

    def run(self, steps: int | None = None, mode: str = "sync", max_staleness: int = 1) -> BackgroundRun | AsyncRun:
        """Train in the background (`steps` trainer steps, or until `stop()`); the kernel stays
        responsive and swaps, syncs and other calls from cells apply between batches.

        mode="sync": step after step (rollout, train, sync). mode="async": generation and training
        overlap; batches more than `max_staleness` policy versions old are dropped (see `loop`).
        """
        self._require_up()
        return self.runs.start(self, steps, mode, max_staleness)

    def pause(self) -> None:
        """Pause the background run after the step in flight; `resume()` goes on."""
        self.runs.pause()

    def resume(self) -> None:
        self.runs.resume()

    def stop(self) -> None:
        """Stop the background run after the step in flight (the mesh stays up)."""
        self.runs.stop()

    def staleness(self) -> pd.Series:
        """Histogram of trained batches by staleness (trainer version - generating version)."""
        steps = self.metrics_stream.to_pandas("step")
        return steps.staleness.value_counts().sort_index() if not steps.empty else pd.Series(dtype=int)

    @property
    def pids(self) -> dict[str, list[int]]:
        """Process ids of each role's procs."""
        return self.actors.pids if self.actors is not None else {}

    @property
    def registry(self) -> Registry:
        """Every reward and loss version (see `versions()` for a table)."""
        return self.live_code.registry

    def dashboard(self):
        """A live ipywidgets dashboard of this session (display it, or let the cell return it)."""
        from forge_nb.notebook.dashboard import Dashboard

        board = Dashboard(self)
        self._dashboards.append(board)
        return board.widget

    def samples(self, n: int = 16, *, step: int | None = None, prompt_id: str | None = None) -> pd.DataFrame:
        """The last `n` samples with rewards, advantages and versions; with `step` or `prompt_id`, every
        sample of that trained step / of that prompt so far, from the rollout log (tokens and logprobs too)."""
        if step is not None or prompt_id is not None:
            if self.rollout_log is None:
                raise SessionError("forge_nb: the rollout log is off (log.samples=False): only s.samples(n)")
            return self.rollout_log.read(step=step, prompt_id=prompt_id)
        from forge_nb.notebook.tables import samples_table

        return samples_table(self, n)

    def watch(self, when: Callable[[dict], bool] | None = None, baseline_steps: int = 5, **thresholds: float) -> Watch:
        """Pause the run when a condition fires at a step boundary (see `forge_nb.watch`): all_equal_groups,
        reward_dominance, length_drift, kl_spike, grad_norm (thresholds), `when` (a predicate over the step
        row). Replaces the conditions watched before; display the result to see what fires."""
        known = ("all_equal_groups", "reward_dominance", "length_drift", "kl_spike", "grad_norm")
        unknown = sorted(set(thresholds) - set(known))
        if unknown:
            raise SessionError(f"forge_nb: no watch condition {unknown[0]!r}; conditions: {', '.join(known)}, when")
        self.watcher = Watch(dict(thresholds), when, baseline_steps)
        return self.watcher

    def unwatch(self) -> None:
        self.watcher = None

    def explore(self):
        """The sample explorer widget: a step's groups, a sample's tokens, pinned prompts, the live generator."""
        from forge_nb.notebook.explorer import Explorer

        return Explorer(self).widget

    def generate(
        self, prompt: str | list[dict], n: int = 1, temperature: float | None = None, max_tokens: int | None = None
    ) -> list[str]:
        """`n` completions of `prompt` (a string, or chat messages: the task's prompt format applies) from
        the weights the generator serves now; nothing is scored, stored or trained on."""
        with self.generation_lock:
            actors = self._require_up()
            _, ids = self.prompts.encode(prompt)
            sampling = self.sampling(n=n, temperature=temperature)
            sampling = dataclasses.replace(sampling, max_tokens=max_tokens or sampling.max_tokens)
            return [c.text for c in actors.generate([ids], sampling).completions[0]]

    @property
    def metrics(self) -> pd.DataFrame:
        """Every metrics row so far (all kinds) as a DataFrame."""
        return self.metrics_stream.to_pandas()

    def save_checkpoint(self, path: str | Path) -> int:
        """Write the trainer's current weights and the tokenizer as an HF model directory -> version."""
        actors = self._require_up()
        with self.training_lock:
            version = actors.save(str(path))
        self.tokenizer.save_pretrained(str(path))
        return version

    def export(self, path: str | Path, steps: int = 100) -> Path:
        """Write a standalone script + sbatch file that reproduce this session (config, current
        weights, live reward and loss) without a notebook -> the directory. See `forge_nb.export`."""
        self._require_up()
        live = {kind: (self.live_code.live(kind).version, self.live_code.registry.members(kind)) for kind in KINDS}
        origin = {"policy_version": self.trainer_version, "steps": self.step_count}
        checkpoint = self.save_checkpoint if self.trainer_version > 0 else None
        return export_bundle(path, self.config, live, steps, origin, checkpoint)

    def checksums(self) -> dict[str, tuple[int, str]]:
        """(version, weights checksum) of the trainer and the generator: equal after a sync with the
        torch engine; vLLM serves its own fused layout (equal across replicas, not the trainer's)."""
        return self._require_up().checksums()

    def status(self) -> dict[str, Any]:
        """Mesh, actors and versions, as a dict (printable in a notebook)."""
        if self.actors is None:
            return {"up": False, "steps": self.step_count}
        run = self.runs.current
        return {
            "up": True,
            **self.actors.describe(),
            "steps": self.step_count,
            "policy_version": {"trainer": self.trainer_version, "generator": self.generator_version},
            "samples": self.buffer.added,
            "reward_version": self.live_code.live("reward").version,
            "loss_version": self.live_code.live("loss").version,
            "run": None if run is None else {"state": run.state, "steps_done": run.done, "error": run.error},
            "events": [{k: r[k] for k in ("time", "role", "what")} for r in self.metrics_stream.rows("event")[-5:]],
            "reward_errors": len(self.reward_errors),
            "last_reward_errors": self.reward_errors[-3:],
            "model": str(self.config.model.resolved_path()),
            "run_dir": str(self.run_dir),
            "log_errors": [e for e in [self.rollout_log and self.rollout_log.error, *self.trackers.errors] if e],
        }

    def set_reward(
        self,
        fn: Callable | str | LiveCode | None = None,
        *,
        version: int | None = None,
        name: str | None = None,
        weight: float | None = None,
    ) -> int:
        """Validate `fn` (a function, a cell's source, or captured code) on recent samples, give it the
        next reward version and make it live in every reward actor from the next batch -> version.
        Several rewards can be live: `name` adds or replaces one (default "reward"), `weight` sets its
        weight in the trained sum (0: logged only; `fn` may be omitted to change just the weight).
        `version=N` makes an earlier set live again (rollback). Bad code raises `LiveCodeError` and the
        live version stays."""
        self._require_up()
        return self.live_code.set("reward", fn, version, name=name, weight=weight)

    def remove_reward(self, name: str) -> int:
        """Take reward `name` out of the live set -> the new reward version."""
        self._require_up()
        return self.live_code.remove("reward", name)

    def set_loss(self, fn: Callable | str | LiveCode | None = None, *, version: int | None = None) -> int:
        """As `set_reward`, for the loss the trainer minimises (validated forward and backward)."""
        self._require_up()
        return self.live_code.set("loss", fn, version)

    def versions(self, kind: str | None = None) -> pd.DataFrame:
        """Every reward / loss version (and rejected candidate): source, time, validation, status."""
        return self.live_code.versions(kind)

    def rescore(self, reward: Callable | str | int, n: int = 256) -> pd.DataFrame:
        """Score the last `n` samples with another reward (a function, source or version number),
        without touching the live one -> DataFrame of old and new rewards side by side."""
        return self.live_code.rescore(reward, n)
