"""vLLM's CPU build served from a trainer gang of 2 procs: each refresh reads both ranks' shards and the
served logprobs equal the trainer's (float32 CPU kernels: to 1e-4)."""

import pytest

from forge_nb.session import Session
from tests.conftest import wait_no_children
from tests.engines.test_vllm_engine import assert_trained_steps_reach_the_engine

pytestmark = pytest.mark.slow


def test_train_and_sync_from_two_trainer_ranks_reach_vllm():
    s = Session.up(engine="vllm", trainer_procs=2, prompts_per_step=4, group_size=4, threads_per_proc=1)
    try:
        assert_trained_steps_reach_the_engine(s, 2)
    finally:
        s.down()
    assert wait_no_children() == []
