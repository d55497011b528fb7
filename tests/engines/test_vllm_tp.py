"""vLLM with ``engine.tensor_parallel_size=2`` (its CPU build) behind the generator of a real session: two
ranks, each a worker process of vLLM's (sharing the cores), serve the bundled model; after every refresh
both ranks serve the trainer's version (the generator's logprobs equal the trainer's at that version, which
a rank left on the old weights would break), LoRA adapters too; `down()` leaves no process, vLLM's workers
included."""

from __future__ import annotations

import re

import psutil
import pytest

from forge_nb.engines.vllm_engine import vllm_available
from forge_nb.runtime.calls import wait
from forge_nb.session import Session
from tests.conftest import child_processes, wait_no_children
from tests.engines.test_vllm_engine import assert_trained_steps_reach_the_engine

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]

TOLERANCE = 1e-4  # max abs logprob difference, vLLM (float32 CPU kernels, two ranks) vs the trainer's HF forward


@pytest.fixture(scope="module")
def s():

    options = {"engine.tensor_parallel_size": 2, "prompts_per_step": 4, "group_size": 4, "threads_per_proc": 1}
    session = Session.up(engine="vllm", **options)
    yield session
    session.down()
    assert wait_no_children() == []


def agreement(s) -> float:
    """Max abs difference between the generator's logprobs of a fresh rollout and the trainer's."""
    r = s.rollout()
    prompts, completions = [e.prompt_ids for e in r.episodes], [e.completion_ids for e in r.episodes]
    trainer = wait(s.fleet.trainer.logprobs.call_one(prompts, completions))
    return max(abs(x - y) for e, t in zip(r.episodes, trainer) for x, y in zip(e.logprobs, t))


def test_lora_at_two_ranks_serves_the_trainers_adapter():
    """With LoRA each version is an adapter vLLM's two ranks serve: on a fixed prompt + completion, the
    generator's logprobs move with training and equal the trainer's after the sync."""

    options = {"engine.tensor_parallel_size": 2, "lora.enabled": True, "prompts_per_step": 4, "group_size": 4}
    running = frozenset(p.pid for p in child_processes())  # the module's session, if a test started it
    s = Session.up(engine="vllm", threads_per_proc=1, **options)
    try:
        assert_trained_steps_reach_the_engine(s, 3)
    finally:
        s.down()
    assert wait_no_children(exclude=running) == []


def vllm_ranks(s) -> list[psutil.Process]:
    """The worker processes of vLLM's ranks under the session's generator proc."""
    generator = psutil.Process(next(r["pid"] for r in s.status()["placement"] if r["role"] == "generator"))
    return [p for p in generator.children(recursive=True) if p.name().startswith("VLLM::Worker")]


def test_two_ranks_serve_each_version_the_trainer_holds(s):
    ranks = vllm_ranks(s)
    assert len(ranks) == 2, [(p.name(), p.cmdline()) for p in ranks]
    assert agreement(s) < TOLERANCE
    before, v = s.checksums()["generator"], s.trainer_version  # (v0 unless another test of the module stepped)
    m = s.step(2)
    assert m["policy_version"].tolist() == [v + 1, v + 2] and (m["refresh_bytes"] > 0).all()
    after = s.checksums()["generator"]
    assert after[0] == v + 2 and after[1] != before[1]
    assert agreement(s) < TOLERANCE  # both ranks took version 2: the logprobs are the trainer's


def test_a_rank_that_dies_ends_its_generator_and_the_session_starts_it_afresh(s):
    """vLLM shuts its executor down for good when a rank's worker dies: the generator proc ends itself (Monarch
    reports it dead), the next call starts a fresh one with two ranks, and it serves the trainer's version."""
    s.step(1)
    old = s.pids["generator"]
    ranks = vllm_ranks(s)
    ranks[1].kill()
    rollout = s.rollout()  # the dead engine's proc ended; the call was issued again on a fresh one
    assert len(rollout.episodes) == 16 and s.pids["generator"] != old
    events = [e["what"] for e in s.status()["events"] if e["role"] == "generator"]
    # Monarch's cause comes first: "... exited with code 1", or under load a timeout querying the proc's agent;
    # then the proc's last words, which name vLLM's dead worker either way.
    said = rf"; generator \(pid {old[0]}\): vLLM's worker VllmWorker-\d died and vLLM shut its executor down\)"
    assert any(f"procs {old} died" in e and "respawned" in e and re.search(said, e) for e in events), events
    assert len(vllm_ranks(s)) == 2 and not any(p.is_running() for p in ranks)
    assert s.checksums()["generator"][0] == s.trainer_version and agreement(s) < TOLERANCE
