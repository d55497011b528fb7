"""One step of GRPO on the mesh, top to bottom: rollout -> score -> advantages -> train -> sync.

    rollout   the generator replicas sample G completions for each of P prompts (policy version v)
    score     the reward procs run the live reward set on every completion (the reference model
              scores the same tokens meanwhile, when KL is on)
    advantages  group-relative, per prompt (`rl.advantages`), plus DAPO's overlong penalty if set
    train     the trainer takes an optimizer step with the live loss (or `algorithm.epochs` x
              `algorithm.mini_batches` of them) and publishes version v + 1
    sync      every generator replica loads v + 1 (/dev/shm on the trainer's host, its TCP streams elsewhere)

The actor calls are in `fleet.fleet.Fleet`, the pure pieces in `rl/pipeline.py` and `rewards/`, the state
they move on in `state.RunState`. Nothing here takes a lock or knows about notebooks: the session holds
the locks around these calls (`Session.step`, `Session.rollout`, ...), and background runs call the
same functions through it (`loop`). Each trained batch becomes one `StepRow` on the metrics stream.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from forge_nb.actors.trainer import LossFailedAfterSteps, TrainResult
from forge_nb.agents.episodes import episodes_of, own_reward, row_of, share_with_segments, trajectory_ends
from forge_nb.engines.base import SamplingParams
from forge_nb.fleet.fleet import Fleet
from forge_nb.rl import pipeline
from forge_nb.rl.episode import Episode
from forge_nb.rl.pipeline import EmptyTrainBatch, reward_batch
from forge_nb.rl.rollout import Rollout
from forge_nb.run.rollout_log import Batch
from forge_nb.state import RunState, SessionError
from forge_nb.tasks import Problem


def rollout(state: RunState, fleet: Fleet, problems: list[Problem] | None = None) -> Rollout:
    """Generate G samples for each prompt (the task's next P by default) -- G multi-turn trajectories
    when an agent rollout is live (`generate_agents`), or the complete groups agents outside the mesh
    contributed when any wait (`take_external`) -- score them, give them group-relative advantages."""
    sampling = state.sampling()
    outside = take_external(state, sampling.n)
    problems = outside[1] if outside else problems or state.task.sample(state.config.algorithm.prompts_per_step)
    state.rollout_count += 1
    if outside:
        trajectories = outside[0]
        episodes, own = episodes_of(trajectories, problems, state.next_sample_id), [own_reward(t) for t in trajectories]
        generate_s, version = max(t.info["seconds"] for t in trajectories), min(e.policy_version for e in episodes)
    elif fleet.envs.live is not None:
        start = time.perf_counter()
        episodes, own = generate_agents(state, fleet, problems, sampling)
        generate_s, version = time.perf_counter() - start, min(e.policy_version for e in episodes)
    else:
        texts, ids = state.prompts.render_all(problems)
        generation = fleet.generate(ids, sampling)
        generate_s, version, own = generation.seconds, generation.policy_version, None
        episodes = pipeline.make_episodes(problems, texts, generation.completions, version, state.next_sample_id)
    state.next_sample_id += len(episodes)
    reference = fleet.ask_reference(episodes)  # the reference runs while the reward procs score
    ends = trajectory_ends(episodes)  # one per sample: a trajectory's earlier segments share its scores
    score_s, weights = score(state, fleet, ends, own)
    reference_s = fleet.attach_reference(episodes, reference)
    advantages(state, ends, sampling.n, weights)
    share_with_segments(episodes)
    accuracy = sum(state.task.verify(e.completion, e.target) for e in ends) / len(ends)
    state.buffer.add(episodes)
    batch = Rollout(episodes, version, accuracy, generate_s, score_s, reference_s)
    state.metrics.emit("rollout", step=state.step_count, epoch=getattr(state.task, "epoch", 0), **batch.summary())
    return batch


def take_external(state: RunState, group_size: int) -> tuple[list, list[Problem]] | None:
    """Complete groups of trajectories that agents outside the mesh closed (`agents.external`) -> (the
    trajectories, their problems), or None when none is waiting: this batch generates as usual."""
    if state.external is None:
        return None
    trajectories, problems = state.external.take(group_size, state.config.algorithm.prompts_per_step)
    return (trajectories, problems) if trajectories else None


def generate_agents(
    state: RunState, fleet: Fleet, problems: list[Problem], sampling: SamplingParams
) -> tuple[list[Episode], list[float | None]]:
    """G trajectories per problem from the live agent rollout, in the env procs (their model calls go to
    the generator replicas, batched per turn) -> one episode per trajectory, and each trajectory's own
    reward (None: the live rewards score its last reply). A trajectory of several segments gives one
    episode per segment (`agents.episodes`); `own` has one entry per trajectory."""
    context = {"step": state.step_count, "policy_version": state.versions.served}
    rows = [row_of(p) for p in problems]
    trajectories = fleet.envs.rollouts(rows, sampling.n, sampling, context)
    return episodes_of(trajectories, problems, state.next_sample_id), [own_reward(t) for t in trajectories]


def score(
    state: RunState, fleet: Fleet, episodes: list[Episode], own: list[float | None] | None = None
) -> tuple[float, dict[str, float]]:
    """The live reward set on every episode, in the reward procs -> (seconds, each member's weight). A sample a
    reward failed on keeps reward None and its error (also in `state.reward_errors`). A trajectory with a reward
    of its own (`own`) trains on that; the live rewards' scores are kept beside it."""
    start, weights = time.perf_counter(), {}
    for part, scores in fleet.score(reward_batch(episodes, state.step_count)):
        state.reward_errors += pipeline.apply_scores(episodes[part], scores)
        weights = {**weights, **scores.weights}  # (every shard scores under the one live set)
    for e, reward in zip(episodes, own or ()):
        if reward is not None and e.reward_error is None:
            e.rewards, e.reward = {**e.rewards, "rollout": reward}, reward
    return time.perf_counter() - start, weights


def advantages(state: RunState, episodes: list[Episode], group_size: int, weights: dict[str, float]) -> None:
    """DAPO's overlong penalty (if `algorithm.overlong_cache`), then group-relative advantages: of the weighted
    sum of the members' scores, or (``algorithm.reward_aggregation="normalize_then_sum"``, GDPO) of each member's
    (`weights`) on its own, then summed."""
    a = state.config.algorithm
    if a.overlong_cache:
        pipeline.add_overlong_penalty(episodes, state.config.engine.max_tokens, a.overlong_cache)
    decoupled = weights if a.normalize_each_reward else None
    pipeline.assign_advantages(episodes, group_size, a.normalize_std, a.group_std == "sample", a.std_over, decoupled)


def train(state: RunState, fleet: Fleet, batch: Rollout, loss_version: int) -> dict[str, Any]:
    """The trainer's steps on the batch's informative groups (one, or `algorithm.epochs` x
    `algorithm.mini_batches`) -> metrics (loss, grad_norm, updates, policy_version, train_seconds, ...).
    Counts one trained batch (`state.step_count`), also when dynamic sampling left nothing to train on (no
    step is taken then; `loss_version` is the live one, for the row). When the live loss failed after the
    batch's first step, the steps before it were published: the batch is recorded as trained and the metrics
    carry ``loss_error``, which the step boundary raises (`raise_loss_error`), after the sync and the row."""
    try:
        a = state.config.algorithm
        episodes = pipeline.train_subset(batch.episodes, a.dynamic_sampling, a.normalize_each_reward)
    except EmptyTrainBatch as e:
        raise SessionError(f"forge_nb: {e}") from None
    behind = staleness(state, batch)
    if episodes:
        kept, masked = state.rollout_log is not None, state.config.algorithm.mask_truncated
        fleet.attach_reference(episodes)  # those a rollout made before the reference ran, if any
        result = fleet.train_batch(episodes, keep_logprobs=kept, mask_truncated=masked)
        for e in episodes:
            e.loss_version = result.loss_version
    else:
        stats = {"loss": 0.0, "grad_norm": 0.0, "tokens": 0, "updates": 0, "skipped": True}
        result = TrainResult(state.versions.trained, loss_version, stats, 0.0, 0.0)
    state.step_count += 1  # this batch is step `step_count`: its train row, step row and log file
    state.metrics.emit("train", step=state.step_count, **result.as_dict())
    log_batch(state, batch, episodes, result.token_logprobs or [], behind)
    trained = {**result.as_dict(), "staleness": behind}
    return trained | ({"loss_error": result.error} if result.error is not None else {})


def staleness(state: RunState, batch: Rollout) -> int:
    """How many policy versions `batch` lags behind the trainer, were it trained now: the trainer's version minus
    the one that generated it (0 on-policy)."""
    return state.versions.trained - batch.policy_version


def raise_loss_error(trained: dict[str, Any]) -> dict[str, Any]:
    """At the step boundary (synced, its row written, `after_step` done): `LossFailedAfterSteps` if the live loss
    failed after the batch's first step (`train`) -> else `trained`."""
    if trained.get("loss_error"):
        raise LossFailedAfterSteps(trained["loss_error"], trained)
    return trained


def sync(state: RunState, fleet: Fleet, source: str = "session") -> dict[str, Any]:
    """Every generator replica loads the trainer's latest version -> report: version,
    previous_version, bytes, seconds, transfer_seconds, total_seconds, gbps, skipped, transport. Its "sync" row
    says what asked for it (`source`: the session's step or sync, or a Tinker client's call)."""
    start = time.perf_counter()
    report = fleet.refresh()
    row = {**report.as_dict(), "total_seconds": time.perf_counter() - start}
    state.metrics.emit("sync", step=state.step_count, source=source, **row)
    return row


def sync_step(state: RunState, fleet: Fleet, loss_version: int) -> tuple[StepRow, Rollout, dict[str, Any]]:
    """rollout -> train -> sync on the task's next prompts -> the step's row (also on the metrics
    stream), the batch and the train metrics."""
    start = time.perf_counter()
    batch = rollout(state, fleet)
    trained = train(state, fleet, batch, loss_version)
    refresh = sync(state, fleet)
    row = record_step(state, "sync", batch, trained, time.perf_counter() - start, refresh)
    return row, batch, trained


def record_step(
    state: RunState,
    mode: str,
    batch: Rollout,
    trained: dict[str, Any],
    seconds: float,
    refresh: dict[str, Any] | None = None,
) -> StepRow:
    """The row of trained batch `state.step_count` (a sync step's, or an async run's, whose refreshes happen
    between generator batches: `refresh` None), on the metrics stream -> the row."""
    row = StepRow.of(state.step_count, mode, batch, trained, state.versions.served, seconds, refresh)
    state.metrics.emit("step", **row.as_dict())
    return row


def log_batch(
    state: RunState, batch: Rollout, trained: list[Episode], logprobs: list, staleness: int, dropped: bool = False
) -> None:
    """The batch into the rollout log (and the trackers' samples tables), as step `state.step_count`;
    `dropped`: an async run found it too stale to train on."""
    ids = [e.sample_id for e in trained]
    entry = Batch(batch.episodes, state.step_count, staleness, frozenset(ids), dict(zip(ids, logprobs)), dropped)
    if state.rollout_log is not None:
        state.rollout_log.append(entry)
    if state.trackers and not dropped:
        state.trackers.on_batch(state.step_count, batch.to_pandas())


NAN = float("nan")
TRAINER_READS = ("entropy", "clip_fraction", "kl_ref", "response_length", "response_length_max")


@dataclass(frozen=True)
class StepRow:
    """One trained batch. Times in seconds; `tokens_per_s` generated tokens per generation second;
    `refresh_gbps` in 1e9 bytes/s over `refresh_bytes` (both 0 in async runs, whose refreshes happen between
    generator batches). `turns`, `tool_calls`, `tool_errors` are NaN in a batch without trajectories.
    `staleness` = trainer version - version that generated the batch, at train time.
    Read by the trainer on the policy's tokens before its step (`rl.update.policy_update`; NaN when no
    step ran): `entropy` (nats per token), `clip_fraction`, `kl_ref` (k3 KL to the reference, NaN without
    one), `response_length` (mean policy tokens per sequence) and `response_length_max`."""

    step: int
    mode: str  # "sync" or "async"
    policy_version: int
    generator_version: int
    staleness: int
    mean_reward: float
    accuracy: float
    tokens_per_s: float
    truncated: float  # share of the batch's completions cut off at max_tokens
    turns: float  # model calls per trajectory
    tool_calls: float  # tool calls in the batch's trajectories, and how many of them failed
    tool_errors: float
    generate_s: float
    score_s: float
    reference_s: float
    train_s: float
    refresh_s: float
    refresh_gbps: float
    refresh_bytes: int
    loss: float
    grad_norm: float
    entropy: float
    clip_fraction: float
    kl_ref: float
    response_length: float
    response_length_max: float
    step_s: float

    @classmethod
    def of(
        cls,
        step: int,
        mode: str,
        batch: Rollout,
        train: dict[str, Any],
        generator_version: int,
        step_s: float,
        refresh: dict[str, Any] | None = None,
    ) -> StepRow:
        return cls(
            step=step,
            mode=mode,
            policy_version=train["policy_version"],
            generator_version=generator_version,
            staleness=train["staleness"],
            mean_reward=batch.mean_reward,
            accuracy=batch.accuracy,
            tokens_per_s=batch.tokens_per_s,
            truncated=batch.truncated,
            **batch.agent_stats,
            generate_s=batch.generate_s,
            score_s=batch.score_s,
            reference_s=batch.reference_s,
            train_s=train["train_seconds"],
            refresh_s=refresh["total_seconds"] if refresh else 0.0,
            refresh_gbps=refresh["gbps"] if refresh else 0.0,
            refresh_bytes=refresh["bytes"] if refresh else 0,
            loss=train["loss"],
            grad_norm=train["grad_norm"],
            **{name: train.get(name, NAN) for name in TRAINER_READS},
            step_s=step_s,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
