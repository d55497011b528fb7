"""vLLM's CPU build served from a trainer gang of 2 procs: each refresh reads both ranks' shards and the
served logprobs equal the trainer's (float32 CPU kernels: to 1e-4)."""

import pytest

import forge_nb
from forge_nb.mesh.calls import on_gang, wait
from tests.conftest import wait_no_children
from tests.engines.test_vllm_engine import TOLERANCE, max_diff

pytestmark = pytest.mark.slow


def test_train_and_sync_from_two_trainer_ranks_reach_vllm():
    s = forge_nb.up(engine="vllm", trainer_procs=2, prompts_per_step=4, group_size=4, threads_per_proc=1)
    try:
        prompt = [s.tokenizer("17+25=")["input_ids"]]
        completion = [s.tokenizer("42", add_special_tokens=False)["input_ids"] + [s.tokenizer.eos_token_id]]
        generator = s.actors.generator.slice(procs=0)
        before, version = wait(generator.score.call_one(prompt, completion))
        for _ in range(2):
            s.train(s.rollout())
        trainer = on_gang(s.actors.trainer, "logprobs", prompt, completion)
        assert max_diff(before, trainer) > 10 * TOLERANCE  # training moved the weights measurably
        report = s.sync()
        after, served = wait(generator.score.call_one(prompt, completion))
        assert served == report["version"] == version + 2
        assert max_diff(after, trainer) < TOLERANCE
    finally:
        s.down()
    assert wait_no_children() == []
