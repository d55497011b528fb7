"""Experiment tracking through the libraries people already use: TensorBoard event files, Weights & Biases
(offline mode works without an account), MLflow (a local file store). Each is off unless its config field
is on (``log.tensorboard``, ``log.wandb``, ``log.mlflow``) and imported only then.

What each receives: every metrics row as scalars per step (``step/...``, ``train/...``, ``eval/...``),
each trained batch's samples as a table, and the source of every reward and loss version the session
made live (logged at the next step boundary after it went live).
"""

from __future__ import annotations

import functools
import html
import json
import math
import numbers
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

SCALAR_KINDS = ("step", "train", "eval", "sync", "rollout")
TABLE_COLUMNS = ["sample_id", "prompt_id", "prompt", "completion", "target", "reward", "advantage", "policy_version"]


class Tracker(Protocol):
    def scalars(self, step: int, values: dict[str, float]) -> None: ...

    def table(self, step: int, samples: pd.DataFrame) -> None: ...

    def text(self, step: int, name: str, source: str) -> None: ...

    def close(self) -> None: ...


class TensorBoard:
    """Event files in `folder` (read them with TensorBoard, or its EventAccumulator)."""

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def table(self, step: int, samples: pd.DataFrame) -> None:
        self.writer.add_text("samples", _markdown(samples), step)

    def text(self, step: int, name: str, source: str) -> None:
        self.writer.add_text(name, f"```python\n{source}\n```", step)

    def close(self) -> None:
        self.writer.close()


class WandB:
    """A W&B run in `folder` (offline by default: `wandb sync` uploads it later)."""

    def __init__(self, folder: Path, config: dict, project: str, mode: str) -> None:
        import wandb

        self.wandb = wandb
        # console "off": W&B leaves the kernel's stdout alone; quiet / silent: no summary printed into the cell.
        settings = wandb.Settings(quiet=True, silent=True, console="off", disable_git=True, save_code=False)
        self.run = wandb.init(
            project=project, dir=str(folder), config=config, mode=mode, reinit="create_new", settings=settings
        )

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def table(self, step: int, samples: pd.DataFrame) -> None:
        self.run.log({"samples": self.wandb.Table(dataframe=samples)}, step=step)

    def text(self, step: int, name: str, source: str) -> None:
        self.run.log({name: self.wandb.Html(f"<pre>{html.escape(source)}</pre>")}, step=step)

    def close(self) -> None:
        self.run.finish()
        if self.wandb.run is None:  # no run of the user's own: stop W&B's service process too
            self.wandb.teardown()


class MLflow:
    """An MLflow run in the file store `folder`/mlruns (browse it with ``mlflow ui --backend-store-uri``).

    Through `MlflowClient` and the run's id, not the fluent API: rows arrive from the background run's
    threads, and the fluent API's active run belongs to the thread that started it."""

    def __init__(self, folder: Path, config: dict, name: str) -> None:
        # MLflow 3 keeps the file store (no database server, nothing more to install) behind this switch.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow import MlflowClient
        from mlflow.entities import Metric, Param

        self.Metric = Metric
        self.client = MlflowClient(tracking_uri=(folder / "mlruns").resolve().as_uri())
        experiment = self.client.get_experiment_by_name("forge_nb")
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment("forge_nb")
        self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
        params = [Param(k, str(v)[:500]) for k, v in _flat(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def scalars(self, step: int, values: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        metrics = [self.Metric(k.replace("/", "."), v, now, step) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def table(self, step: int, samples: pd.DataFrame) -> None:
        self.client.log_table(self.run_id, samples, artifact_file=f"samples/step-{step:08d}.json")

    def text(self, step: int, name: str, source: str) -> None:
        self.client.log_text(self.run_id, source, f"{name}.py")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def make_trackers(log: Any, run_dir: Path, config: dict, name: str) -> list[Tracker]:
    """The trackers `log` (a `LogConfig`) turns on, writing under `run_dir`."""
    trackers: list[Tracker] = []
    if log.tensorboard:
        trackers.append(TensorBoard(run_dir / "tensorboard"))
    if log.wandb:
        trackers.append(WandB(run_dir, config, log.wandb_project, log.wandb_mode))
    if log.mlflow:
        trackers.append(MLflow(run_dir, config, name))
    return trackers


class Trackers:
    """The trackers the config turns on, fed from the metrics stream, the trained batches and the registry."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers
        self.errors: list[str] = []  # a tracker that raised is dropped (training goes on); why, here
        self._live_logged: set[tuple[str, int]] = set()
        self._lock = threading.Lock()  # rows come from the background run's threads and the kernel's

    def _each(self, call: Callable[[Tracker], None]) -> None:
        with self._lock:
            for t in list(self.trackers):
                try:
                    call(t)
                except Exception as e:
                    self.trackers.remove(t)
                    self.errors.append(f"{type(t).__name__}: {type(e).__name__}: {e} (it logs nothing more)")

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def on_row(self, row: dict[str, Any]) -> None:
        """A metrics row: its numbers as scalars (``<kind>/<name>``) at its step."""
        if row.get("kind") not in SCALAR_KINDS or "step" not in row:
            return
        values = {
            f"{row['kind']}/{k}": float(v)
            for k, v in row.items()
            if k not in ("time", "kind", "step")
            and isinstance(v, numbers.Real)
            and not isinstance(v, bool)
            and math.isfinite(float(v))
        }
        self._each(lambda t: t.scalars(int(row["step"]), values))

    def on_batch(self, step: int, samples: pd.DataFrame) -> None:
        table = samples[[c for c in TABLE_COLUMNS if c in samples.columns]]
        self._each(lambda t: t.table(step, table))

    def on_versions(self, step: int, records: list) -> None:
        """Every live-code version not logged yet that went live: its members' sources."""
        for r in records:
            if r.version is None or (r.kind, r.version) in self._live_logged or r.status == "rejected":
                continue
            self._live_logged.add((r.kind, r.version))
            source = "\n\n".join(f"# {name} (weight {m.weight:g})\n{m.code.source}" for name, m in r.members.items())
            self._each(functools.partial(_text, step=step, name=f"live/{r.kind}_v{r.version}", source=source))

    def close(self) -> None:
        self._each(lambda t: t.close())


def _text(tracker: Tracker, step: int, name: str, source: str) -> None:
    tracker.text(step, name, source)


def _markdown(df: pd.DataFrame) -> str:
    """A small markdown table (TensorBoard's text plugin renders it)."""
    head = "| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns) + "\n"
    rows = [
        "| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ")[:120] for v in r) + " |"
        for r in df.head(64).itertuples(index=False)
    ]
    return head + "\n".join(rows)


def _flat(config: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        out.update(_flat(v, f"{key}.") if isinstance(v, dict) else {key: json.dumps(v) if isinstance(v, list) else v})
    return out
