"""The step's order and bookkeeping, on a stand-in fleet (the real ones are tested on a mesh)."""

from types import SimpleNamespace

from forge_nb import step
from forge_nb.actors.generator import Generation
from forge_nb.actors.trainer import TrainResult
from forge_nb.config import Config
from forge_nb.engines.base import Completion
from forge_nb.rewards.batch import Scores
from forge_nb.state import RunState
from forge_nb.tasks import make_task
from forge_nb.weights.refresh import RefreshReport


class _Prompts:
    def render_all(self, problems):
        return [p.prompt for p in problems], [[1, 2] for _ in problems]


class _Fleet:
    """Records the calls the step makes, in order, and answers like the actors do."""

    def __init__(self, state: RunState) -> None:
        self.state, self.calls, self.kept_logprobs = state, [], []
        self.envs = SimpleNamespace(live=None)  # no agent rollout: one completion per sample

    def generate(self, ids, sampling):
        self.calls.append("generate")
        group = [Completion([1, 2], [3], [-0.5], str(i), "stop") for i in range(sampling.n)]
        return Generation([group for _ in ids], self.state.versions.served, 0.1)

    def ask_reference(self, episodes):
        return None

    def attach_reference(self, episodes, reference=None):
        return 0.0

    def score(self, batch):
        self.calls.append("score")
        rewards = [float(i % 2) for i in range(len(batch))]
        return [(slice(0, len(batch)), Scores(rewards, components={"reward": rewards}))]

    def train_batch(self, episodes, keep_logprobs=True, mask_truncated=False):
        self.calls.append("train_batch")
        self.kept_logprobs.append(keep_logprobs)
        self.state.versions.trained += 1
        return TrainResult(self.state.versions.trained, 0, {"loss": 0.3, "grad_norm": 1.5}, 0.2, 0.01)

    def refresh(self):
        self.calls.append("refresh")
        self.state.versions.served = self.state.versions.trained
        return RefreshReport(self.state.versions.served, 0, 1000, 0.5, 0.4, False, "shm")


def _state() -> RunState:
    config = Config().updated({"prompts_per_step": 2, "group_size": 2})
    state = RunState(config, make_task(config.task, 0))
    state.prompts = _Prompts()
    return state


def test_a_sync_step_is_rollout_score_train_sync_and_emits_one_row_per_phase():
    state = _state()
    roles = _Fleet(state)
    row, batch, trained = step.sync_step(state, roles, loss_version=0)
    assert roles.calls == ["generate", "score", "train_batch", "refresh"]
    assert (row.step, row.mode, row.policy_version, row.generator_version, row.staleness) == (1, "sync", 1, 1, 0)
    assert (row.train_s, row.refresh_gbps, row.loss) == (0.2, 1000 / 0.5 / 1e9, 0.3) and trained["grad_norm"] == 1.5
    assert [e.sample_id for e in batch.episodes] == [0, 1, 2, 3] and state.next_sample_id == 4
    assert [e.advantage != 0 for e in batch.episodes] == [True] * 4  # rewards 0, 1 in each group of 2
    assert state.step_count == 1 and state.rollout_count == 1 and state.buffer.added == 4
    assert [r["kind"] for r in state.metrics.rows()] == ["rollout", "train", "sync", "step"]


def test_a_batch_with_nothing_to_train_counts_a_step_but_takes_none():
    state = _state()
    state.config = Config().updated({"prompts_per_step": 2, "group_size": 2, "dynamic_sampling": True})
    roles = _Fleet(state)
    batch = step.rollout(state, roles)
    for e in batch.episodes:
        e.reward, e.advantage = 1.0, 0.0  # every group all-equal: dynamic sampling leaves nothing
    trained = step.train(state, roles, batch, loss_version=3)
    assert "train_batch" not in roles.calls and trained["skipped"] and trained["loss_version"] == 3
    assert state.step_count == 1 and state.versions.trained == 0


def test_the_trainer_answers_with_its_logprobs_only_when_a_rollout_log_keeps_them():
    state = _state()
    roles = _Fleet(state)
    step.sync_step(state, roles, loss_version=0)  # no rollout log (`log.samples` false)
    logged = []
    state.rollout_log = SimpleNamespace(append=logged.append)
    step.sync_step(state, roles, loss_version=0)
    assert roles.kept_logprobs == [False, True] and [b.step for b in logged] == [2]


def test_gdpo_takes_the_members_weights_from_the_scores():
    """With reward_aggregation="normalize_then_sum", each member is normalised in its group on its own, weighted
    as the reward procs weighted it."""

    class _TwoMembers(_Fleet):
        def score(self, batch):
            components = {"big": [100.0 * (i // 2 % 2) for i in range(len(batch))]}
            components["small"] = [float(i % 2) for i in range(len(batch))]
            return [(slice(0, len(batch)), Scores.combine(components, {"big": 1.0, "small": 2.0}, {}, 1))]

    advantages = {}
    for aggregation in ("sum_then_normalize", "normalize_then_sum"):
        state = _state()
        state.config = Config().updated({"prompts_per_step": 1, "group_size": 4, "reward_aggregation": aggregation})
        episodes = step.rollout(state, _TwoMembers(state)).episodes
        advantages[aggregation] = [e.advantage for e in episodes]
    plain, gdpo = advantages["sum_then_normalize"], advantages["normalize_then_sum"]
    assert abs(plain[1] - plain[0]) < 0.05 < abs(gdpo[1] - gdpo[0])  # "small" counts only when normalised alone
