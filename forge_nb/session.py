"""Session: the controller of one RL post-training run on a Monarch mesh (what a session's server holds, or a script
in its own process).

    s = Session.up()            # generator, trainer and reward actors in their own procs
    r = s.rollout()             # generate P x G samples, score them, group-relative advantages
    m = s.train(r)              # one GRPO step on the trainer; policy version v -> v + 1
    w = s.sync()                # generator pulls v + 1 (/dev/shm on this host, Monarch RDMA across hosts)
    s.down()                    # every proc stopped

It holds the locks and delegates: the step to `step` (on the `state.RunState` it owns), the actors to
`fleet.Fleet`, live code to `live.manager`, background runs to `loop`, checkpoints to `run.checkpoints`. Data
flows one way: session -> step -> fleet -> actors -> engines and algorithms; notebook views wrap a session.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer

from forge_nb import evaluation, heap, step, tables
from forge_nb.agents.client import Limits
from forge_nb.agents.external import ExternalAgents, OpenTrajectory
from forge_nb.config import Config
from forge_nb.engines.base import Completion, SamplingParams
from forge_nb.export import export_bundle
from forge_nb.fleet.fleet import Fleet, StartFrom
from forge_nb.launch.slurm import SlurmError
from forge_nb.live.agents import AgentRollouts
from forge_nb.live.capture import LiveCode
from forge_nb.live.manager import LiveCodeManager
from forge_nb.live.registry import Registry
from forge_nb.loop import AsyncRun, BackgroundRun, RunSlot
from forge_nb.metrics import MetricsStream
from forge_nb.rl.episode import Episode
from forge_nb.rl.rollout import Rollout
from forge_nb.run import checkpoint_files
from forge_nb.run.checkpoints import Checkpoints
from forge_nb.runtime import lifecycle, refusals
from forge_nb.runtime.refusals import Refusals
from forge_nb.state import RunState, SessionError, new_run_dir
from forge_nb.status import session_status
from forge_nb.step import StepRow
from forge_nb.tasks import Problem, make_task
from forge_nb.tasks.data import take_task_data
from forge_nb.tasks.prompts import PromptFormat, check_lengths
from forge_nb.watch import StepView, Watch

__all__ = ["Session", "SessionError"]


class Session:
    """What a notebook, a script or the CLI holds: one run's state, its actors, its live code, its endpoint."""

    def __init__(self, config: Config, data: Any = None) -> None:
        self.config = config.validate()
        self.state = RunState(self.config, make_task(config.task, config.seed, data))  # your rows, task.path, bundled
        self.run_id, self.run_dir = new_run_dir(config, id(self))  # the rollout log, trackers, checkpoints
        self.checkpoints = Checkpoints(config, self.run_dir)
        self.live_code = LiveCodeManager(config)
        self.agents = AgentRollouts(lambda: self.live_code.registry)
        self.fleet: Fleet | None = None
        self.watcher: Watch | None = None
        self._watch_fired = False
        self._steps_interrupted = threading.Event()  # `interrupt_steps`: a step(n) stops at its next boundary
        # The generator side (rollout, sync, reward and rollout swaps) and the trainer side (train, loss swaps)
        # each hold their lock for a whole batch, so swaps and calls from cells land between batches.
        self.generation_lock = threading.RLock()
        self.training_lock = threading.RLock()
        self.runs = RunSlot()
        self.tinker: Any = None  # `server.tinker.TinkerEndpoint` once `serve_tinker` started it
        # Connections the session's listeners refused, as "security" events (at most one a second).
        self._refused = Refusals(report=lambda what: self._event("security", what))
        self._refused_seen: dict[str, int] = {}
        self._refused_polled = 0.0
        self._refused_lock = threading.Lock()

    # -- start and stop ------------------------------------------------------------------------------
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
        ckpt = checkpoint_files.read(path)
        session = cls(Config.from_dict(ckpt.session_config()).updated(overrides), ckpt.data)
        start, session.live_code.registry = session.checkpoints.load(ckpt, session.state)
        session._start(start)
        return session

    def fork(self, step: int) -> Session:
        """A new session, in this kernel beside this one, from the newest checkpoint at or before `step`
        (those this session saved, and the periodic ones in the checkpoint folder)."""
        if (found := self.checkpoints.newest(at_or_before=step)) is None:
            steps = self.checkpoints.steps()
            raise SessionError(f"forge_nb: no checkpoint at or before step {step} (checkpoints at steps {steps})")
        return type(self).restore(found)

    def _start(self, start: StartFrom | None = None) -> None:
        cfg, model_dir, state = self.config, str(self.config.model.resolved_path()), self.state
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        state.prompts = PromptFormat(self.tokenizer, cfg.task.prompt_format, cfg.task.system_prompt)
        context = cfg.engine.max_model_len or AutoConfig.from_pretrained(model_dir).max_position_embeddings
        check_lengths(state.task.known_problems(), state.prompts, context, cfg.engine.max_tokens)  # before any proc
        self.engine_name = cfg.engine_name()
        rewards, loss = self.live_code.registry.members("reward"), self.live_code.live("loss").code
        state.open_logs(self.run_dir, self.run_id)
        try:
            args = (cfg, self.engine_name, self.tokenizer.pad_token_id, rewards, loss, state.versions)
            self.fleet = fleet = Fleet(*args, self._event, start)
            if cfg.checkpoint.on_trainer_failure == "restore":
                fleet.restore_from = self.checkpoints.newest
            fleet.judges.connect(state.metrics)  # "judge" rows: the judge's calls and timings
            lifecycle.register(self)  # after the spawns: our exit hook then runs before the ones Monarch adds
            fleet.wait_ready()
            fleet.weights.attach()
            self.live_code.connect(fleet, self.generation_lock, self.training_lock, state, self.probe_samples)
            self.agents.connect(fleet.envs, self.generation_lock, lambda a: evaluation.probe_agents(fleet, state, a))
            self.agents.restore()
            self.note_refusals(procs=True, report=False)  # what a host's worker refused before this session started
            heap.hold(self)  # the start-up heap out of full collections while this session is up
            if cfg.session.tinker_port is not None:
                self.serve_tinker(cfg.session.tinker_host, cfg.session.tinker_port)
        except Exception as e:
            self.down()
            if isinstance(e, SlurmError):
                raise SessionError(f"forge_nb: the Slurm mesh failed to start: {e}") from None
            raise SessionError(f"forge_nb: the mesh failed to start ({type(e).__name__}): {e}") from e

    def _event(self, role: str, what: str) -> None:
        """Something happened to the mesh (a proc replaced, ...): on the metrics stream, in `status()`."""
        self.state.metrics.emit("event", step=self.state.step_count, role=role, what=what)

    def note_refusals(self, procs: bool = False, report: bool = True) -> None:
        """Connections refused since the last look, said in one "security" event at most once a second: those of
        this process's listeners (the session's socket, its agents' endpoint, its Monarch port) and, with `procs`,
        those of its procs (a trainer's weights streams, env procs' endpoints) and of their hosts' workers
        (`runtime.refusals`). `report` False: only take note (what came before this session)."""
        totals = refusals.REFUSED.totals()
        fleet = self.fleet
        if procs and fleet is not None:
            for key, count in fleet.refusals().items():
                totals[key] = max(totals.get(key, 0), count)
        with self._refused_lock:
            if report:
                self._refused.add(totals, self._refused_seen)
            else:
                self._refused_seen.update({k: max(v, self._refused_seen.get(k, 0)) for k, v in totals.items()})

    @property
    def is_up(self) -> bool:
        return self.fleet is not None

    def down(self) -> None:
        """Stop every proc this session started, and its endpoint. Safe to call twice."""
        self.runs.stop()
        self._stop_endpoint()
        fleet, self.fleet = self.fleet, None
        lifecycle.unregister(self)
        self.state.close_logs()
        heap.release(self)
        if fleet is None:
            return
        self._event("session", "down")
        errors = fleet.stop()
        if errors:
            raise SessionError("forge_nb: some procs did not stop cleanly: " + "; ".join(errors))

    def at_exit(self) -> None:
        """This process is exiting: the controller goes, and every proc with it."""
        self.down()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _require_up(self) -> Fleet:
        if self.fleet is None:
            raise SessionError("forge_nb: the session is down; start one with forge_nb.up()")
        return self.fleet

    # -- read-only views of the run's state ----------------------------------------------------------
    @property
    def metrics_stream(self) -> MetricsStream:
        return self.state.metrics

    @property
    def step_count(self) -> int:  # trained batches
        return self.state.step_count

    @property
    def trainer_version(self) -> int:  # the policy version the trainer published last
        return self.state.versions.trained

    @property
    def generator_version(self) -> int:  # the policy version the generator serves
        return self.state.versions.served

    # -- the step: locks here, work in `forge_nb.step` ---------------------------------------------------
    def rollout(self, problems: list[Problem] | None = None) -> Rollout:
        """Generate G samples for each of P prompts, score them, compute group-relative advantages."""
        with self.generation_lock:
            return step.rollout(self.state, self._require_up(), problems)

    def train(self, rollout: Rollout) -> dict[str, Any]:
        """The trainer's steps on `rollout` (one, or `algorithm.epochs` x `algorithm.mini_batches`) -> metrics
        (loss, grad_norm, updates, policy_version, train_seconds, ...). Counts one trained batch (`step_count`)."""
        with self.training_lock:
            trained = step.train(self.state, self._require_up(), rollout, self.live_code.live("loss").version)
        return step.raise_loss_error(trained)

    def sync(self) -> dict[str, Any]:
        """Refresh the generator with the trainer's latest published version -> report: version,
        previous_version, bytes, seconds, transfer_seconds, total_seconds, gbps, skipped, transport."""
        with self.generation_lock:
            return step.sync(self.state, self._require_up())

    def sync_step(self) -> StepRow:
        """rollout -> train -> sync holding both sides (no swap or call lands mid-step), then the step boundary."""
        with self.whole_step():
            loss_version = self.live_code.live("loss").version
            row, batch, trained = step.sync_step(self.state, self._require_up(), loss_version)
            self.after_step(row, batch, trained)
        step.raise_loss_error(trained)
        return row

    def step(self, n: int = 1, progress: bool = True) -> pd.DataFrame:
        """n x (rollout, train, sync) -> a row per step (reward, accuracy, tokens/s, phase times, GB/s); a progress
        bar from 5 steps on, unless `progress=False`."""
        bar = tqdm(range(n), desc="forge_nb step", disable=n < 5 or not progress, leave=False)
        rows, self._watch_fired = [], False
        self._steps_interrupted.clear()
        for _ in bar:
            rows.append(self.sync_step().as_dict())
            if self._watch_fired or self._steps_interrupted.is_set():  # a watch fired, or the caller's cell was
                break  # interrupted (a client's Ctrl-C, `interrupt_steps`): stop here, as a breakpoint would
        return pd.DataFrame(rows, columns=list(StepRow.__dataclass_fields__)).set_index("step")

    def interrupt_steps(self) -> None:
        """Stop a `step(n)` in progress at its next step boundary (the step in flight ends whole)."""
        self._steps_interrupted.set()

    @contextmanager
    def whole_step(self) -> Iterator[None]:
        """Hold both sides: no swap or call from another thread lands until the block ends."""
        with self.generation_lock, self.training_lock:
            yield

    def after_step(self, row: StepRow, rollout: Rollout, train: dict[str, Any]) -> None:
        """At the step boundary: evaluation and a checkpoint when due; the trackers hear of new live-code
        versions; the watch checks its conditions and, when one fires, pauses the run."""
        if time.monotonic() - self._refused_polled >= refusals.POLL_S:
            self._refused_polled = time.monotonic()
            self.note_refusals(procs=True)
        if self.state.eval_due():
            self.evaluate()
        if self.checkpoints.due(self.state.step_count):
            self.checkpoints.periodic(self.state.step_count, self.save, self._event)
        if self.state.trackers:
            self.state.trackers.on_versions(self.state.step_count, self.live_code.registry.records)
        weights = {n: m.weight for n, m in self.live_code.registry.members("reward").items()}
        fired = self.watcher.check(StepView(row.as_dict(), rollout, train, weights)) if self.watcher else None
        if fired is not None:
            self._watch_fired = True
            self.runs.pause()
            self.state.metrics.emit("watch", step=fired.step, condition=fired.condition, message=fired.message)

    def on_dropped(self, rollout: Rollout, staleness: int) -> None:
        """A batch the async run dropped (too stale): logged, never trained."""
        step.log_batch(self.state, rollout, [], [], staleness, dropped=True)

    # -- background runs -------------------------------------------------------------------------------
    @property
    def background(self) -> BackgroundRun | AsyncRun | None:
        """The latest background run (its `state`, `done` steps and `error`), if any."""
        return self.runs.current

    def run(self, steps: int | None = None, mode: str = "sync", max_staleness: int = 1) -> BackgroundRun | AsyncRun:
        """Train in the background (`steps` trainer steps, or until `stop()`); the kernel stays free and calls
        from cells apply between batches. mode="sync": step after step. mode="async": generation and training
        overlap; batches more than `max_staleness` policy versions old are dropped (see `loop`)."""
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

    # -- evaluation and generation -----------------------------------------------------------------------
    def evaluate(self, max_tokens: int | None = None, greedy: bool | None = None) -> dict[str, float]:
        """The held-out prompts under the generator's current weights, greedy or sampled (`eval.*`, or
        `greedy` for this call): heldout_accuracy (the task's verifier), eval_reward, per member, ..."""
        with self.generation_lock:
            return evaluation.evaluate(self._require_up(), self.state, max_tokens, greedy)

    def probe_samples(self, n: int) -> list[Episode]:
        """`n` fresh samples of held-out prompts for validating live code before the first rollout."""
        return evaluation.probe_samples(self._require_up(), self.state, n)

    def prompt(self, i: int = 0) -> str:
        """Held-out problem `i`'s prompt as the model sees it: the task's prompt format and, for a chat model, the
        tokenizer's chat template (system prompt included)."""
        return self.state.prompts.render(self.state.task.eval_set()[i])[0]

    def generate(
        self, prompt: str | list[dict], n: int = 1, temperature: float | None = None, max_tokens: int | None = None
    ) -> list[str]:
        """`n` completions of `prompt` (a string, or chat messages: the task's prompt format applies) from
        the weights the generator serves now; nothing is scored, stored or trained on."""
        with self.generation_lock:
            sampling = self.state.sampling(n=n, temperature=temperature)
            return evaluation.generate(self._require_up(), self.state.prompts, prompt, sampling, max_tokens)

    # -- live code ---------------------------------------------------------------------------------------
    def set_reward(
        self,
        fn: Callable | str | LiveCode | None = None,
        *,
        version: int | None = None,
        name: str | None = None,
        weight: float | None = None,
    ) -> int:
        """Validate `fn` (a function, a cell's source, or captured code) on recent samples, give it the next
        reward version and make it live in every reward actor from the next batch -> version. `name` adds or
        replaces one of several live rewards (default "reward"), `weight` is its weight in the trained sum (0:
        logged only; without `fn`: a new weight). `version=N` rolls back. Bad code raises `LiveCodeError`."""
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
        """Every reward / loss version (and rejected candidate): source, time, validation, status; and every
        policy version the generators were refreshed to (kind "policy": what asked for it, when, bytes, seconds).
        `kind` ("reward", "loss", "rollout", "env", "policy"): those only."""
        if kind == "policy":
            return tables.policy_versions(self.state.metrics, self.state.versions.served)
        table = self.live_code.versions(kind)
        if kind is not None:
            return table
        refreshes = tables.policy_versions(self.state.metrics, self.state.versions.served)
        return pd.concat([t for t in (table, refreshes) if not t.empty], ignore_index=True) if len(refreshes) else table

    def rescore(self, reward: Callable | str | int, n: int = 256) -> pd.DataFrame:
        """Score the last `n` samples with another reward (a function, source or version number),
        without touching the live one -> DataFrame of old and new rewards side by side."""
        return self.live_code.rescore(reward, n)

    def set_rollout(
        self, fn: Callable | None = None, *, tools: Sequence[Callable] = (), version: int | None = None
    ) -> int:
        """Train agents: `fn` is ``async def rollout(client, row, **context)``, its model calls through `client`
        (the OpenAI chat API) served by the generator, `tools` plain functions run in the env procs (`agents`).
        Checked on probe rows, versioned like a reward; `version=0` goes back to one completion per sample."""
        self._require_up()
        return self.agents.set("rollout", fn, tools, version)

    def set_env(self, cls: type | None = None, *, version: int | None = None) -> int:
        """Train agents on an environment class with ``reset(row)`` / ``step(action) -> (observation, reward,
        done)``: one instance per trajectory, the turns run by forge_nb (see `set_rollout`)."""
        self._require_up()
        return self.agents.set("env", cls, (), version)

    @property
    def registry(self) -> Registry:
        """Every reward and loss version (see `versions()` for a table)."""
        return self.live_code.registry

    # -- agents outside the mesh ---------------------------------------------------------------------------
    def endpoint(self, host: str = "127.0.0.1") -> ExternalAgents:
        """The session's OpenAI-compatible endpoint (started on first use on `host`, stopped by `down`): `.url`
        and `.api_key` (the per-session token every request must carry), `.trajectory(row)`."""
        self._require_up()
        if self.state.external is None:
            agent = self.config.agent
            limits = Limits(agent.max_turns, agent.max_total_tokens, self.config.engine.max_tokens)
            sampling = replace(self.state.sampling(1), seed=None)
            self.state.external = ExternalAgents(self.tokenizer, self._generate_ids, sampling, limits, host)
        return self.state.external

    @contextmanager
    def trajectory(self, row: dict) -> Iterator[OpenTrajectory]:
        """One trajectory of `row` for an agent in another process: ``with s.trajectory(row) as t:`` gives
        `t.base_url` and `t.api_key`; `t.reward(x)` sets its reward. Closed trajectories train at the next
        batch once `algorithm.group_size` of the same row are in (`agents.external`)."""
        with self.endpoint().trajectory(row) as opened:
            yield opened

    def _generate_ids(self, prompts: list[list[int]], sampling: SamplingParams) -> tuple[list[list[Completion]], int]:
        with self.generation_lock:
            generation = self._require_up().generate(prompts, sampling)
        return generation.completions, generation.policy_version

    def _stop_endpoint(self) -> None:
        external, self.state.external = self.state.external, None
        if external is not None:
            external.stop()
        tinker, self.tinker = self.tinker, None
        if tinker is not None:
            tinker.stop()

    def serve_tinker(self, host: str = "127.0.0.1", port: int = 0):
        """The Tinker API (the `tinker` SDK's REST protocol) served by this session, on its own mesh: `.url`
        (the SDK's ``base_url`` / ``TINKER_BASE_URL``) and `.api_key` (``TINKER_API_KEY``, a ``tml-`` key every
        request must carry). Started on first use on `host`:`port` (127.0.0.1, a free port: this machine only;
        another address only where asked for), stopped by `down`; later calls return it. See
        docs/guides/tinker.md for what is served."""
        self._require_up()
        if self.tinker is not None:
            if host != self.tinker.host or port not in (0, self.tinker.port):
                raise SessionError(
                    f"forge_nb: the session already serves the Tinker API at {self.tinker.url} "
                    f"(host {self.tinker.host!r}); one endpoint per session"
                )
            return self.tinker
        try:
            from forge_nb.server.tinker import TinkerEndpoint
        except ImportError as e:
            raise SessionError(
                f"forge_nb: the Tinker API needs the tinker SDK ({e}): pip install 'forge_nb[tinker]'"
            ) from e
        self.tinker = TinkerEndpoint(self, host, port).start()
        return self.tinker

    # -- inspection ----------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Mesh, actors, versions, the background run, recent events and errors, as a dict (`status`)."""
        status = session_status(self.state, self.fleet, self.live_code, self.runs, self.run_dir)
        if self.tinker is not None:
            status["tinker"] = self.tinker.stats()
        return status

    @property
    def pids(self) -> dict[str, list[int]]:
        """Process ids of each role's procs."""
        return self.fleet.pids if self.fleet is not None else {}

    @property
    def metrics(self) -> pd.DataFrame:
        """Every metrics row so far (all kinds) as a DataFrame."""
        return self.state.metrics.to_pandas()

    def samples(self, n: int = 16, *, step: int | None = None, prompt_id: str | None = None) -> pd.DataFrame:
        """The last `n` samples with rewards, advantages and versions; with `step` or `prompt_id`, every
        sample of that trained step / of that prompt so far, from the rollout log (tokens and logprobs too)."""
        return tables.samples(self.state.buffer, self.state.rollout_log, n, step, prompt_id)

    def staleness(self) -> pd.Series:
        """Histogram of trained batches by staleness (trainer version - generating version)."""
        return tables.staleness(self.state.metrics)

    def watch(self, when: Callable[[dict], bool] | None = None, baseline_steps: int = 5, **thresholds: float) -> Watch:
        """Pause the run when a condition fires at a step boundary (see `forge_nb.watch`): all_equal_groups,
        reward_dominance, length_drift, kl_spike, grad_norm (thresholds), `when` (a predicate over the step
        row). Replaces the conditions watched before; display the result to see what fires."""
        self.watcher = Watch.of(thresholds, when, baseline_steps)
        return self.watcher

    def unwatch(self) -> None:
        self.watcher = None

    def checksums(self, *roles: str) -> dict[str, tuple[int, str]]:
        """(version, weights checksum) of trainer and generator: equal after a torch engine's sync (vLLM: its own).
        `roles` ("trainer", "generator", "generator_replicas") reads only those."""
        return self._require_up().checksums(*roles)

    # -- checkpoints and export ----------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write a checkpoint of this session at `path` (between batches) -> its folder: weights, optimizer and RNG,
        counters and versions, the task stream's position, the buffer, every reward and loss version, the metrics
        (`forge_nb.run.checkpoints`). `forge_nb.resume(path)` goes on from it."""
        with self.whole_step():
            fleet = self._require_up()
            return self.checkpoints.save(path, self.state, fleet, self.live_code.registry, self.tokenizer)

    def save_checkpoint(self, path: str | Path) -> int:
        """Write the trainer's current weights and the tokenizer as an HF model directory -> version."""
        with self.training_lock:
            return self.checkpoints.save_model(path, self._require_up(), self.tokenizer)

    def export(self, path: str | Path, steps: int = 100) -> Path:
        """A standalone script + sbatch file reproducing this session without a notebook -> the directory."""
        self._require_up()
        origin = {"policy_version": self.trainer_version, "steps": self.step_count}
        weights = self.save_checkpoint if self.trainer_version > 0 else None
        return export_bundle(path, self.config, self.live_code.live_sets(), steps, origin, weights)
