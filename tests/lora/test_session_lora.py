"""LoRA through a session on the bundled model: the served adapter a checkpoint keeps when the generator is a
version behind, and an export that runs from the merged model with the adapter beside it."""

import peft
import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from forge_nb.models import BUNDLED_MODEL
from forge_nb.session import Session
from tests.conftest import wait_no_children

SMALL = {"prompts_per_step": 4, "group_size": 4, "threads_per_proc": 1, "lr": 1e-2}
LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def test_a_checkpoint_between_train_and_sync_keeps_the_served_adapter_one_version_behind(tmp_path):
    s = Session.up(lora=LORA, **SMALL)
    try:
        s.step(1)
        s.train(s.rollout())  # trained, not synced
        sums = s.checksums()
        assert sums["trainer"][0] == 2 and sums["generator"][0] == 1 and sums["trainer"] != sums["generator"]
        s.save(tmp_path / "ck")
    finally:
        s.down()
    assert (tmp_path / "ck" / "generator" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "ck" / "trainer" / "adapter_config.json").is_file()
    r = Session.restore(tmp_path / "ck")
    try:
        assert r.config.lora.enabled and (r.trainer_version, r.generator_version) == (2, 1)
        assert r.checksums()["trainer"] == sums["trainer"] and r.checksums()["generator"] == sums["generator"]
        assert r.sync()["version"] == 2
        after = r.checksums()
        assert after["trainer"] == after["generator"] == sums["trainer"]
    finally:
        r.down()
    assert wait_no_children() == []


def test_an_export_runs_from_the_merged_model_with_the_adapter_beside_it(tmp_path):
    s = Session.up(lora=LORA, **SMALL)
    try:
        s.step(1)
        out = s.export(tmp_path / "bundle")
        trained = s.fleet.trainer.logprobs.call_one([[1, 5, 7]], [[3, 9]]).get()
    finally:
        s.down()
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["model"]["path"] == str(out / "checkpoint" / "merged") and config["lora"]["enabled"]
    AutoTokenizer.from_pretrained(out / "checkpoint" / "merged")
    ids = torch.tensor([[1, 5, 7, 3, 9]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(out / "checkpoint" / "merged").eval()(ids).logits
        base = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL)
        adapted = peft.PeftModel.from_pretrained(base, out / "checkpoint").eval()(ids).logits
    for logits in (merged, adapted):
        logprobs = logits[0].log_softmax(-1)
        got = [logprobs[2, 3].item(), logprobs[3, 9].item()]
        assert max(abs(a - b) for a, b in zip(got, trained[0])) < 1e-4
    assert wait_no_children() == []
