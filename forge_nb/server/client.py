"""The client half of a session: the `Session` API, in a kernel or a script, for a session whose server (this
user's, on this host) owns the mesh.

    s = forge_nb.up()              # starts a server and attaches; in a notebook, attaches to the notebook's own
    s = forge_nb.attach("exp1")    # the same session from another kernel or script
    r = s.rollout(); s.train(r)    # calls on the server; `r` is a handle whose samples stay there
    s.down()                       # the session and every proc, the server included

Live code is captured here, in the kernel (its source and what it uses, `live.closure`), and travels as that
spec; the server validates, versions and ships it. The metrics stream is mirrored here (a thread reads new rows as
they come), so dashboards and the sidebar draw from it as they do in-process. Errors raised in the server are
raised here, their server traceback as the cause (`%tb`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

import pandas as pd

from forge_nb.errors import SessionDown, SessionError
from forge_nb.metrics import MetricsStream
from forge_nb.runtime import lifecycle
from forge_nb.server.handshake import prove_to_server
from forge_nb.server.protocol import Hello, RolloutView, RunView
from forge_nb.server.registry import RegistryError, SessionDir


class SessionGone(SessionError):
    """The session's server is no longer there (ended, or killed)."""


class SessionClient:
    """What a notebook or a script holds of a session served elsewhere; the API of `Session`. `persist`: at this
    process's exit the session outlives it (a kernel's default) or goes down with it (a script's default)."""

    def __init__(self, folder: SessionDir, persist: bool = True) -> None:
        self.name, self._folder, self.persist = folder.name, folder, persist
        self._key = folder.key()
        self._id = uuid.uuid4().hex
        self._idle: list[Connection] = []
        self._pool_lock = threading.Lock()
        self._closed = False
        self.metrics_stream = RemoteMetrics(self)
        self._facts: dict[str, Any] = {}
        self._tokenizer = None

    # -- connecting -----------------------------------------------------------------------------------------------
    def _connect(self) -> Connection:
        try:
            conn = Client(str(self._folder.socket), family="AF_UNIX")
            prove_to_server(conn, self._key)
            conn.send(Hello.here(self._id))
        except (FileNotFoundError, ConnectionRefusedError, EOFError, ConnectionResetError) as e:
            raise self._gone() from e
        return conn

    def _gone(self) -> SessionGone:
        info = self._folder.info()
        last = f"; its last checkpoint: {info.last_checkpoint}" if info and info.last_checkpoint else ""
        return SessionGone(f"forge_nb: the session {self.name!r} is gone (its server ended){last}")

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`method` on the server -> its value (its error raised here). An exclusive command that another client
        runs now is waited for, after saying who holds the session."""
        if self._closed:
            raise SessionError(f"forge_nb: this client of {self.name!r} is detached; forge_nb.attach({self.name!r})")
        reply = self._roundtrip(("call", method, args, kwargs, False))
        if reply[0] == "busy":
            print(f"forge_nb: session {self.name!r} is busy ({reply[1]}); waiting for it", flush=True)
            reply = self._roundtrip(("call", method, args, kwargs, True))
        kind, value = reply
        if kind == "error":
            raise value.exception()
        return value

    def _roundtrip(self, message: tuple) -> tuple:
        with self._pool_lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        try:
            conn.send(message)
            reply = conn.recv()
        except (EOFError, OSError) as e:
            conn.close()
            raise self._gone() from e
        except KeyboardInterrupt:  # the cell interrupted: the server stops a step(n) at its next step boundary
            conn.close()  # (its reply would come on this connection; kept, it would count as a client attached)
            self._interrupt(message)
            raise
        with self._pool_lock:
            if self._closed:  # detached meanwhile: a connection kept would count as a client attached
                conn.close()
            else:
                self._idle.append(conn)
        return reply

    def _interrupt(self, message: tuple) -> None:
        """Ask the server to stop what `message` started at its next step boundary (best effort: a server that
        is gone or busy going down has nothing to stop)."""
        if message[1] in ("down", "wait_up", "interrupt"):
            return
        try:
            conn = self._connect()
            try:
                conn.send(("call", "interrupt", (), {}, False))
                conn.recv()
            finally:
                conn.close()
        except Exception:
            pass

    def wait_up(self, timeout: float | None = None) -> dict[str, Any]:
        """Block until the session is up (its start's error raised here) -> its status."""
        return self._call("wait_up", timeout)

    # -- what the session is ------------------------------------------------------------------------------------
    def _fact(self, name: str) -> Any:
        self._facts = self._call("facts")
        return self._facts[name]

    @property
    def config(self):
        return self._facts.get("config") or self._fact("config")

    @property
    def run_dir(self) -> Path:
        return Path(self._facts.get("run_dir") or self._fact("run_dir"))

    @property
    def run_id(self) -> str:
        return self._facts.get("run_id") or self._fact("run_id")

    @property
    def engine_name(self) -> str:
        return self._facts.get("engine") or self._fact("engine")

    @property
    def is_up(self) -> bool:
        if self._closed:
            return False
        try:
            return bool(self._fact("is_up"))
        except (SessionGone, SessionDown):  # its server ended, or is taking the session down
            return False

    @property
    def step_count(self) -> int:
        return self._fact("step_count")

    @property
    def trainer_version(self) -> int:
        return self._fact("trainer_version")

    @property
    def generator_version(self) -> int:
        return self._fact("generator_version")

    @property
    def pids(self) -> dict[str, list[int]]:
        return self._fact("pids")

    @property
    def tokenizer(self):
        """The session's tokenizer, loaded here from the model's folder (this host's, as the server's)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self._facts.get("model_dir") or self._fact("model_dir"))
        return self._tokenizer

    # -- the step -------------------------------------------------------------------------------------------------
    def rollout(self, problems: list | None = None) -> ClientRollout:
        """Generate G samples for each of P prompts, score them, compute group-relative advantages -> the batch,
        kept in the server (`ClientRollout`: its summary here, its samples on request)."""
        return ClientRollout(self._call("rollout", problems), self)

    def train(self, rollout: ClientRollout | RolloutView) -> dict[str, Any]:
        """The trainer's steps on `rollout` (made by `rollout()` of this session) -> metrics."""
        view = rollout.view if isinstance(rollout, ClientRollout) else rollout
        if not isinstance(view, RolloutView) or view.session != self.name:
            raise SessionError("forge_nb: train() takes a rollout this session made (s.rollout())")
        return self._call("train", view.handle)

    def sync(self) -> dict[str, Any]:
        """Refresh the generator with the trainer's latest version -> report (version, bytes, seconds, GB/s, ...)."""
        return self._call("sync")

    def step(self, n: int = 1, progress: bool = True) -> pd.DataFrame:
        """n x (rollout, train, sync) -> a row per step; a progress bar from 5 steps on, unless `progress=False`."""
        bar = None
        if progress and n >= 5:
            bar = _StepBar(self.metrics_stream, n)
        try:
            return self._call("step", n)
        finally:
            if bar is not None:
                bar.close()

    # -- background runs ----------------------------------------------------------------------------------------
    def run(self, steps: int | None = None, mode: str = "sync", max_staleness: int = 1) -> ClientRun:
        """Train in the background, in the server: it goes on while no client is attached (see `Session.run`)."""
        self._call("run", steps, mode, max_staleness)
        return ClientRun(self)

    @property
    def background(self) -> ClientRun | None:
        """The latest background run, if any."""
        return ClientRun(self) if self._call("background") is not None else None

    def pause(self) -> None:
        self._call("pause")

    def resume(self) -> None:
        self._call("resume")

    def stop(self) -> None:
        self._call("stop")

    # -- evaluation and generation ------------------------------------------------------------------------------
    def evaluate(self, max_tokens: int | None = None, greedy: bool | None = None) -> dict[str, float]:
        return self._call("evaluate", max_tokens, greedy)

    def prompt(self, i: int = 0) -> str:
        """Held-out problem `i`'s prompt as the model sees it (see `Session.prompt`)."""
        return self._call("prompt", i)

    def generate(
        self, prompt: str | list[dict], n: int = 1, temperature: float | None = None, max_tokens: int | None = None
    ) -> list[str]:
        return self._call("generate", prompt, n, temperature, max_tokens)

    # -- live code (captured here) --------------------------------------------------------------------------------
    def set_reward(
        self, fn: Any = None, *, version: int | None = None, name: str | None = None, weight: float | None = None
    ) -> int:
        """See `Session.set_reward`: `fn` is captured here and validated in the session -> the version."""
        return self._call("set_reward", _captured("reward", fn), version=version, name=name, weight=weight)

    def remove_reward(self, name: str) -> int:
        return self._call("remove_reward", name)

    def set_loss(self, fn: Any = None, *, version: int | None = None) -> int:
        return self._call("set_loss", _captured("loss", fn), version=version)

    def set_rollout(
        self, fn: Callable | None = None, *, tools: Sequence[Callable] = (), version: int | None = None
    ) -> int:
        from forge_nb.live.closure import capture_callable

        code = capture_callable("rollout", fn) if fn is not None else None
        captured = tuple(capture_callable("tool", t) for t in tools)
        return self._call("set_rollout", code, captured, version)

    def set_env(self, cls: type | None = None, *, version: int | None = None) -> int:
        from forge_nb.live.closure import capture_callable

        return self._call("set_env", capture_callable("env", cls) if cls is not None else None, version)

    def versions(self, kind: str | None = None) -> pd.DataFrame:
        return self._call("versions", kind)

    @property
    def registry(self):
        """Every reward and loss version (a copy: the session's own stays in the server)."""
        return self._call("registry")

    def rescore(self, reward: Callable | str | int, n: int = 256) -> pd.DataFrame:
        code = reward if isinstance(reward, int) and not isinstance(reward, bool) else _captured("reward", reward)
        return self._call("rescore", code, n)

    # -- inspection -------------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return self._call("status")

    @property
    def metrics(self) -> pd.DataFrame:
        return self._call("metrics")

    def samples(self, n: int = 16, *, step: int | None = None, prompt_id: str | None = None) -> pd.DataFrame:
        return self._call("samples", n, step, prompt_id)

    def staleness(self) -> pd.Series:
        return self._call("staleness")

    def watch(self, when: Callable[[dict], bool] | None = None, baseline_steps: int = 5, **thresholds: float):
        """See `Session.watch`; `when` travels by value (cloudpickle) and runs in the server at each step's end."""
        import cloudpickle

        from forge_nb.server.views import WatchView

        predicate = cloudpickle.dumps(when) if when is not None else None
        watched = self._call("watch", thresholds, predicate, baseline_steps)
        return WatchView(self, watched["thresholds"], watched["when"])

    def unwatch(self) -> None:
        self._call("unwatch")

    def checksums(self, *roles: str) -> dict[str, Any]:
        return self._call("checksums", *roles)

    # -- checkpoints and export ---------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        return self._call("save", str(Path(path).expanduser().resolve()))

    def save_checkpoint(self, path: str | Path) -> int:
        return self._call("save_checkpoint", str(Path(path).expanduser().resolve()))

    def export(self, path: str | Path, steps: int = 100) -> Path:
        return self._call("export", str(Path(path).expanduser().resolve()), steps)

    def fork(self, step: int):
        """A new session (its own server) from the newest checkpoint at or before `step`, held by a client of this
        one's class (a notebook's fork has `dashboard()` too)."""
        from forge_nb.server.start import resume

        return resume(self._call("checkpoint_before", step), client_class=type(self))

    # -- agents outside the mesh ----------------------------------------------------------------------------------
    def endpoint(self, host: str = "127.0.0.1"):
        """The session's OpenAI-compatible endpoint, served by the session's server: `.url`, `.api_key`."""
        from forge_nb.server.views import EndpointView

        return EndpointView(**self._call("endpoint", host))

    def serve_tinker(self, host: str = "127.0.0.1", port: int = 0):
        """The Tinker API served by the session's server (see `Session.serve_tinker`): `.url`, `.api_key`,
        `.env()` for a script's environment."""
        from forge_nb.server.views import TinkerView

        return TinkerView(**self._call("serve_tinker", host, port))

    @contextmanager
    def trajectory(self, row: dict) -> Iterator[Any]:
        """One trajectory of `row` for an agent in another process (see `Session.trajectory`)."""
        from forge_nb.server.views import TrajectoryView

        opened = TrajectoryView(**self._call("open_trajectory", row))
        try:
            yield opened
        except BaseException as e:
            self._call("close_trajectory", opened.id, opened.given_reward, f"{type(e).__name__}: {e}")
            raise
        self._call("close_trajectory", opened.id, opened.given_reward, None)

    # -- ending -------------------------------------------------------------------------------------------------------
    def down(self) -> None:
        """Stop the session: every proc it started, its server too. Safe to call twice."""
        if self._closed:
            return
        try:
            kind, value = self._roundtrip(("call", "down", (), {}, True))
        except SessionGone:
            kind = "ok"
        self.detach()
        if kind == "error":  # the server ended anyway; what did not stop is named here
            raise value.exception()

    def detach(self) -> None:
        """Let go of the session: it goes on in its server (`forge_nb.attach(name)` takes it up again)."""
        self._closed = True
        self.metrics_stream.stop()
        lifecycle.unregister(self)
        with self._pool_lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def at_exit(self) -> None:
        """This process is exiting: detach (the session goes on), or take it down unless it `persist`s."""
        if self.persist:
            self.detach()
        else:
            self.down()

    def __enter__(self) -> SessionClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def __repr__(self) -> str:
        return f"<forge_nb session {self.name!r}{'' if not self._closed else ' (detached)'}>"


class ClientRollout:
    """A batch the session's server keeps: its summary, its samples as a table (`to_pandas`), its episodes."""

    def __init__(self, view: RolloutView, client: SessionClient) -> None:
        self.view, self._client = view, client

    def __getattr__(self, name: str) -> Any:
        if name in ("policy_version", "accuracy", "mean_reward", "tokens_per_s", "truncated", "generate_s",
                    "score_s", "reference_s"):  # fmt: skip
            return getattr(self.view, name)
        raise AttributeError(name)

    @property
    def num_tokens(self) -> int:
        return self.view.tokens

    def summary(self) -> dict[str, Any]:
        return dict(self.view.summary)

    @property
    def agent_stats(self) -> dict[str, float]:
        """As `Rollout.agent_stats`: mean model calls per trajectory, tool calls and errors in all (NaN: no agent)."""
        return {k: self.view.summary[k] for k in ("turns", "tool_calls", "tool_errors")}

    @property
    def episodes(self) -> list:
        """The batch's episodes, fetched from the server (token ids and logprobs included)."""
        return self._client._call("rollout_episodes", self.view.handle)

    def to_pandas(self) -> pd.DataFrame:
        return self._client._call("rollout_table", self.view.handle)

    def __len__(self) -> int:
        return self.view.samples

    def __repr__(self) -> str:
        v = self.view
        return (
            f"Rollout({v.samples} samples, policy v{v.policy_version}, mean reward {v.mean_reward:.3f}, "
            f"{v.tokens_per_s:.0f} tokens/s)"
        )


class ClientRun:
    """The session's background run, read from its server at each look."""

    def __init__(self, client: SessionClient) -> None:
        self._client = client

    def _view(self) -> RunView:
        view = self._client._call("background")
        if view is None:
            raise SessionError("forge_nb: the session has no background run")
        return view

    def __getattr__(self, name: str) -> Any:
        if name in RunView.__dataclass_fields__:
            return getattr(self._view(), name)
        raise AttributeError(name)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the run finishes (or `timeout` s pass)."""
        self._client._call("wait_run", timeout)

    def pause(self) -> None:
        self._client.pause()

    def resume(self) -> None:
        self._client.resume()

    def stop(self) -> None:
        self._client.stop()

    def __repr__(self) -> str:
        v = self._view()
        return f"<background run: {v.state}, {v.done} steps done ({v.mode}), started by {v.started_by}>"


class RemoteMetrics(MetricsStream):
    """The session's metrics stream, mirrored: every row the server has (history first), then each new one as it
    arrives (a daemon thread long-polls the server while anyone subscribes or reads)."""

    def __init__(self, client: SessionClient) -> None:
        super().__init__()
        self._client = client
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._caught_up = threading.Event()

    def _ensure(self) -> None:
        if self._thread is None and not self._stopped.is_set():
            self._thread = threading.Thread(target=self._follow, name="forge_nb-metrics", daemon=True)
            self._thread.start()
            self._caught_up.wait(10.0)

    def _follow(self) -> None:
        while not self._stopped.is_set():
            try:
                self._fetch(wait_s=1.0)
            except Exception:
                if self._stopped.wait(1.0):
                    return
                continue
            self._caught_up.set()

    def _fetch(self, wait_s: float) -> None:
        """The server's rows this mirror lacks (waiting up to `wait_s` for one), appended in order; the follower and
        a reader may both fetch: the stream is append-only, so a row already here is skipped by its index."""
        with self._lock:
            first = len(self._rows)
        new = self._client._call("rows_since", first, wait_s)
        with self._lock:
            fresh = new[len(self._rows) - first :]
            self._rows.extend(fresh)
            subscribers = list(self._subscribers)
        for row in fresh:
            for notify in subscribers:
                try:
                    notify(row)
                except Exception:
                    pass  # a view that fails to draw a row does not stop the stream

    def subscribe(self, notify):
        self._ensure()
        return super().subscribe(notify)

    def rows(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every row so far, the server's newest included (read now, not when the follower next wakes)."""
        self._ensure()
        if not self._stopped.is_set():
            self._fetch(wait_s=0.0)
        return super().rows(kind)

    def emit(self, kind: str, **values: Any) -> dict[str, Any]:
        raise SessionError("forge_nb: a client's metrics stream is read-only (the session emits in its server)")

    def stop(self) -> None:
        self._stopped.set()


class _StepBar:
    """A progress bar of `n` steps drawn from the "step" rows of the metrics stream."""

    def __init__(self, stream: MetricsStream, n: int) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=n, desc="forge_nb step", leave=False)
        self._unsubscribe = stream.subscribe(self._on_row)
        self._started = time.time()

    def _on_row(self, row: dict[str, Any]) -> None:
        if row.get("kind") == "step" and row.get("time", 0) >= self._started:
            self.bar.update()

    def close(self) -> None:
        self._unsubscribe()
        self.bar.close()


def _captured(kind: str, fn: Any) -> Any:
    """Live code as it travels: captured here from a function or a cell's source; None and versions as they are."""
    if fn is None:
        return None
    from forge_nb.live.manager import capture

    return capture(kind, fn)


def attach_to(folder: SessionDir, persist: bool = True, client_class: type = SessionClient) -> SessionClient:
    """A client of the running session in `folder` (`SessionGone` if its server ended)."""
    info = folder.info()
    if info is None:
        raise RegistryError(f"forge_nb: no session named {folder.name!r}")
    if not info.alive:
        last = f"; its last checkpoint: {info.last_checkpoint}" if info.last_checkpoint else ""
        raise SessionGone(f"forge_nb: the session {folder.name!r} is gone (its server, pid {info.pid}, ended){last}")
    client = client_class(folder, persist)
    client.wait_up()
    lifecycle.register(client)
    return client
