"""One session with a gang of 2 trainer procs, a sharded reference and 2 generator replicas, on a host that
pretends to have 4 GPUs: each proc runs with the GPUs the placement plan gave it, and live losses run on
every rank (a bad one changes nothing)."""

import psutil
import pytest

from forge_nb.actors.trainer import LossFailed
from forge_nb.session import Session
from tests.conftest import wait_no_children

SMALL = {"prompts_per_step": 4, "group_size": 4, "threads_per_proc": 1}


@pytest.fixture(scope="module")
def gang():
    """2 trainer procs and a sharded reference (KL on), on a host that pretends to have 4 GPUs."""
    s = Session.up(trainer_procs=2, generator_procs=2, gpus_per_host=4, kl_coef=0.05, **SMALL)
    yield s
    s.down()
    assert wait_no_children() == []


def test_each_proc_runs_with_the_gpus_the_plan_gave_it(gang):
    rows = gang.status()["placement"]
    by_role = {}
    for row in rows:
        by_role.setdefault(row["role"], []).append(row)
    assert [r["devices"] for r in by_role["trainer"]] == [[0], [1]]
    assert [r["devices"] for r in by_role["reference"]] == [[0], [1]]  # sharded like the trainer, on its GPUs
    assert [r["devices"] for r in by_role["generator"]] == [[2], [3]] and by_role["reward"][0]["devices"] == []
    for row in rows:
        env = psutil.Process(row["pid"]).environ()
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, row["devices"])), row
        if row["role"] in ("trainer", "reference"):
            assert env["LOCAL_RANK"] == str(row["proc"])
    for role in ("trainer", "reference"):  # each proc joined the group at its rank
        assert [(i.details["rank"], i.details["procs"]) for i in gang.fleet.info[role]] == [(0, 2), (1, 2)]


def test_a_live_loss_runs_on_every_rank_and_a_bad_one_changes_nothing(gang):
    def doubled(logprobs, old_logprobs, advantages, mask, ref_logprobs):
        ratio, r = (logprobs - old_logprobs).exp(), ref_logprobs - logprobs
        per_token = -ratio * advantages[:, None] + 0.05 * (r.exp() - r - 1)
        return 2 * (per_token * mask).sum() / mask.sum()

    version = gang.set_loss(doubled)
    metrics = gang.train(gang.rollout())
    assert metrics["loss_version"] == version and metrics["grad_norm"] > 0
    assert gang.sync()["replicas"] == 2
    sums = gang.checksums()  # both replicas read both ranks' shards (shm) and serve the trainer's weights
    assert {c for _, c in sums["generator_replicas"]} == {sums["trainer"][1]}

    def broken(logprobs, old_logprobs, advantages, mask, ref_logprobs):
        import torch.distributed

        if torch.distributed.is_initialized():  # passes the probe (the checker proc), fails in the gang
            raise ValueError("no")
        return doubled(logprobs, old_logprobs, advantages, mask, ref_logprobs)

    before = gang.checksums()["trainer"]
    gang.set_loss(broken)
    with pytest.raises(LossFailed, match="raised ValueError: no; no step was taken"):
        gang.train(gang.rollout())
    assert gang.checksums()["trainer"] == before  # no rank stepped
    gang.set_loss(doubled)
    assert gang.step(1).iloc[-1]["policy_version"] == before[0] + 1


def test_an_async_run_at_two_procs_logs_the_trainers_logprobs_of_every_trained_sample(gang):
    """Async mode with a gang: batches trained within the staleness bound, and the rollout log holds the
    trainer's logprobs of every trained sample (the whole batch's: each rank computed its rows, rank 0
    answers with all of them)."""
    first = gang.step_count + 1
    run = gang.run(steps=3, mode="async", max_staleness=1)
    run.wait(300)
    assert run.state == "finished", run.error
    assert run.done == 3 and max(run.staleness) <= 1
    log = gang.state.rollout_log.read()
    trained = log[log.trained & (log.step >= first)]
    assert sorted(trained.step.unique()) == [first, first + 1, first + 2]
    assert (trained.groupby("step").size() == 16).all()
    assert trained.trainer_logprobs.map(len).eq(trained.num_tokens).all()
    sums = gang.checksums()
    assert sums["trainer"][0] == gang.trainer_version
