"""LoRA on a trainer gang of 2 procs: the adapter trains on FSDP2 shards, the trainer answers for the
reference (the base, adapter off) on every rank, refreshes ship the adapter only, and a checkpoint made
at 2 procs resumes at 1 with the adapter and its optimizer state bit for bit."""

from forge_nb.session import Session
from tests.conftest import wait_no_children

SMALL = {"prompts_per_step": 4, "group_size": 4, "threads_per_proc": 1}


def test_lora_with_kl_at_two_procs_trains_syncs_and_resumes_at_one(tmp_path):
    s = Session.up(trainer_procs=2, lora={"r": 4, "alpha": 8.0}, kl_coef=0.05, lr=5e-3, **SMALL)
    try:
        trainer = s.status()["trainer"]
        assert trainer["lora"] and s.fleet.reference is None  # the trainer is the reference
        assert trainer["loaded"] == "by rows"  # each rank read its own rows of the model's files
        s.step(1)
        metrics = s.train(s.rollout())
        assert metrics["kl_ref"] >= 0.0 and metrics["grad_norm"] > 0  # reference logprobs from every rank
        s.sync()
        sums = s.checksums()
        assert sums["trainer"] == sums["generator"]  # the served adapter is the trained one
        s.save(tmp_path / "ck")
        saved = sums["trainer"]
    finally:
        s.down()
    r = Session.restore(tmp_path / "ck", trainer_procs=1)
    try:
        assert r.checksums()["trainer"] == saved
        assert r.step(1).iloc[-1]["policy_version"] == saved[0] + 1
    finally:
        r.down()
    assert wait_no_children() == []
