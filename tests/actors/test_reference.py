"""The reference-model actor and the KL penalty on a real mesh (algorithm.kl_coef > 0)."""

from __future__ import annotations

import pytest

from forge_nb.live.capture import LiveCodeError
from forge_nb.runtime.calls import wait
from forge_nb.session import Session
from tests.conftest import child_processes, wait_no_children

KL_LOSS = """
from forge_nb.rl.losses import grpo_loss, kl_penalty

def loss(logprobs, old_logprobs, advantages, mask, ref_logprobs):
    return grpo_loss(logprobs, old_logprobs, advantages, mask) + kl_penalty(logprobs, ref_logprobs, mask, 1.0)
"""


def test_kl_to_the_frozen_reference_starts_at_zero_and_grows_as_the_policy_moves():
    # The module's `session` fixture may already run (its procs are not this test's to stop).
    before = frozenset(p.pid for p in child_processes())
    s = Session.up(prompts_per_step=4, group_size=4, threads_per_proc=1, kl_coef=0.05, lr=5e-3, engine="torch")
    try:
        assert "reference" in s.status()["procs"]
        assert "KL(reference)" in s.registry.live("loss").code.origin
        rollout = s.rollout()
        # The reference scored the rollout while the rewards were computed: each episode carries
        # its logprobs, which at version 0 are the generator's own.
        assert rollout.reference_s >= 0.0
        for e in rollout.episodes:
            assert len(e.ref_logprobs) == len(e.completion_ids)
            assert max(abs(a - b) for a, b in zip(e.ref_logprobs, e.logprobs)) < 1e-5
        first = s.train(rollout)
        assert abs(first["kl_ref"]) < 1e-6  # version 0 is the reference
        later = [s.step(1).iloc[0] for _ in range(4)]
        assert s.metrics_stream.to_pandas("train").kl_ref.iloc[-1] > 1e-4
        assert all(row.policy_version > 0 for row in later)
        # The reference does not move: its logprobs of a fixed completion stay those of version 0.
        prompt, completion = [[1, 6, 4, 7, 15]], [[9, 2]]
        assert wait(s.fleet.reference.logprobs.call_one(prompt, completion)) == wait(
            s.fleet.reference.logprobs.call_one(prompt, completion)
        )
        assert s.set_loss(KL_LOSS) == 1
        rollout = s.rollout()
        for e in rollout.episodes:  # as a rollout made before the reference started would be
            e.ref_logprobs = None
        assert s.train(rollout)["loss_version"] == 1
        assert all(e.ref_logprobs is not None for e in rollout.episodes)  # fetched for the step
        # Async: the generating thread gets the reference logprobs; every trained batch has its KL.
        run = s.run(3, mode="async", max_staleness=1)
        run.wait(120)
        assert run.error is None and run.done == 3
        assert s.metrics_stream.to_pandas("train").kl_ref.tail(3).notna().all()
    finally:
        s.down()
    assert wait_no_children(exclude=before) == []


def test_a_loss_that_needs_ref_logprobs_without_a_reference_is_refused(session):
    with pytest.raises(LiveCodeError, match=r"takes ref_logprobs, but no reference model runs.*kl_coef > 0"):
        session.set_loss(KL_LOSS)
