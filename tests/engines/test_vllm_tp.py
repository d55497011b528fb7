"""vLLM with ``engine.tensor_parallel_size=2`` (its CPU build) behind the generator of a real session: two
ranks, each a worker process of vLLM's on a core of its own, serve the bundled model; after every refresh
both ranks serve the trainer's version (the generator's logprobs equal the trainer's at that version, which
a rank left on the old weights would break); `down()` leaves no process, vLLM's workers included."""

from __future__ import annotations

import psutil
import pytest

from forge_nb.engines.vllm_engine import vllm_available
from forge_nb.mesh.calls import wait
from tests.conftest import wait_no_children

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]

TOLERANCE = 1e-4  # max abs logprob difference, vLLM (float32 CPU kernels, two ranks) vs the trainer's HF forward


@pytest.fixture(scope="module")
def s():
    import forge_nb

    options = {"engine.tensor_parallel_size": 2, "prompts_per_step": 4, "group_size": 4, "threads_per_proc": 1}
    session = forge_nb.up(engine="vllm", **options)
    yield session
    session.down()
    assert wait_no_children() == []


def agreement(s) -> float:
    """Max abs difference between the generator's logprobs of a fresh rollout and the trainer's."""
    r = s.rollout()
    prompts, completions = [e.prompt_ids for e in r.episodes], [e.completion_ids for e in r.episodes]
    trainer = wait(s.actors.trainer.logprobs.call_one(prompts, completions))
    return max(abs(x - y) for e, t in zip(r.episodes, trainer) for x, y in zip(e.logprobs, t))


def test_two_ranks_serve_each_version_the_trainer_holds(s):
    generator = psutil.Process(next(r["pid"] for r in s.status()["placement"] if r["role"] == "generator"))
    ranks = [p for p in generator.children(recursive=True) if p.name().startswith("VLLM::Worker")]
    assert len(ranks) == 2, [(p.name(), p.cmdline()) for p in generator.children(recursive=True)]
    assert agreement(s) < TOLERANCE
    before = s.checksums()["generator"]
    m = s.step(2)
    assert m["policy_version"].tolist() == [1, 2] and (m["refresh_bytes"] > 0).all()
    after = s.checksums()["generator"]
    assert after[0] == 2 and after[1] != before[1]
    assert agreement(s) < TOLERANCE  # both ranks took version 2: the logprobs are the trainer's
