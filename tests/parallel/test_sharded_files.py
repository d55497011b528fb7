"""A sharded policy reads and writes HF directories shard by shard (2 ranks, FSDP2 on gloo, real
processes): made from its own rows it holds what `from_pretrained` gives, and the directory its ranks
write together is the one `save_pretrained` (or peft) writes of the same weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from forge_nb.config import AlgorithmConfig, LoraConfig, TrainerConfig
from forge_nb.models import BUNDLED_MODEL
from forge_nb.testing.gang import run_gang
from tests.parallel.test_policy import batches

WORLD = 2
SMALL_FILES = 40_000  # bytes: the bundled model (1.7 MB) in several files


def rank_work(rank: int, world: int, dirs: dict[str, str], out: str) -> dict:
    """On each rank: policies of the bundled model (and of a tied model stored in bfloat16, and of one
    stored as pytorch_model.bin), one GRPO step each, saved by the ranks together -> what each loaded
    and published."""
    from forge_nb.live.builtin import builtin_loss
    from forge_nb.live.capture import compile_function
    from forge_nb.live.validate import check_loss_value
    from forge_nb.parallel import fsdp, sharded_save
    from forge_nb.parallel.gang import Gang
    from forge_nb.parallel.policy import Policy, PolicySpec

    gang = Gang.join(torch.device("cpu"), 60.0)
    loss_fn = compile_function(builtin_loss(AlgorithmConfig(loss="grpo"), max_tokens=6))
    result = {}
    for case, source in dirs.items():
        lora = LoraConfig(enabled=True, r=4, alpha=8.0) if case.startswith("lora") else None
        resume = str(Path(out) / "lora") if case == "lora_resume" else ""  # what the "lora" case saved
        spec = PolicySpec(source, "float32", "cpu", 0, 1.0, TrainerConfig(), True, 5e-3, lora, resume)
        policy = Policy(spec, gang)
        loaded = {n: t.clone() for n, t in fsdp.whole_tensors(policy.model.named_parameters())}
        if resume:
            result[case] = {"by_rows": policy.by_rows, "loaded": loaded}
            continue
        policy.update(batches(1)[0], loss_fn, 1.0, check_loss_value, True)
        policy.save_pretrained(Path(out) / case, merged=True)
        if case == "bundled":
            fsdp.reshard(policy.model)
            sharded_save.write(policy.model, gang, Path(out) / "several_files", SMALL_FILES)
        trained = {n: t.clone() for n, t in fsdp.whole_tensors(policy.model.named_parameters())}
        result[case] = {"by_rows": policy.by_rows, "loaded": loaded, "trained": trained}
        if case == "bundled":
            result["failed_save"] = _save_failing_on_rank_1(policy, gang, Path(out) / case)
    return result


def _save_failing_on_rank_1(policy, gang, folder: Path) -> str:
    """Save again into `folder` (which holds a save) while rank 1's disk is full -> what this rank raised."""
    import errno

    from forge_nb.parallel import sharded_save

    def disk_full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    kept, sharded_save.write_at = sharded_save.write_at, disk_full if gang.rank == 1 else sharded_save.write_at
    try:
        sharded_save.write(policy.model, gang, folder)
    except OSError as e:
        return str(e)
    finally:
        sharded_save.write_at = kept
    return "no error"


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> tuple[list[dict], Path, dict[str, str]]:
    models = tmp_path_factory.mktemp("models")
    dirs = {"bundled": str(BUNDLED_MODEL), "tied_bf16": str(models / "tied"), "bin": str(models / "bin")}
    dirs["lora"] = dirs["lora_resume"] = str(BUNDLED_MODEL)
    config = LlamaConfig.from_pretrained(str(BUNDLED_MODEL))
    config.tie_word_embeddings = True
    torch.manual_seed(3)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(dirs["tied_bf16"])
    bundled = AutoModelForCausalLM.from_pretrained(str(BUNDLED_MODEL))
    bundled.config.save_pretrained(dirs["bin"])  # transformers 5 writes safetensors only: the .bin by hand
    torch.save(bundled.state_dict(), Path(dirs["bin"]) / "pytorch_model.bin")
    out = tmp_path_factory.mktemp("saved")
    return run_gang(WORLD, rank_work, dirs, str(out)), out, dirs


def reference(source: str) -> dict[str, torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    return dict(model.named_parameters())


@pytest.mark.parametrize("case", ["bundled", "tied_bf16"])
def test_a_sharded_policy_made_from_its_rows_holds_what_from_pretrained_gives(ranks, case):
    results, _, dirs = ranks
    expected = reference(dirs[case])
    for rank in results:
        assert rank[case]["by_rows"]
        assert rank[case]["loaded"].keys() == expected.keys()  # a tied head is the embedding: one tensor
        for name, tensor in rank[case]["loaded"].items():
            assert tensor.dtype == torch.float32 and torch.equal(tensor, expected[name]), name


def test_a_directory_without_safetensors_is_loaded_whole_and_saved_from_a_whole_copy(ranks):
    results, out, dirs = ranks
    assert not results[0]["bin"]["by_rows"]
    expected = reference(dirs["bin"])
    assert all(torch.equal(t, expected[n]) for n, t in results[0]["bin"]["loaded"].items())
    saved = reference(str(out / "bin"))
    assert all(torch.equal(t, saved[n]) for n, t in results[0]["bin"]["trained"].items())


def test_the_ranks_write_the_directory_save_pretrained_writes(ranks, tmp_path):
    results, out, _ = ranks
    trained = results[0]["bundled"]["trained"]
    model = AutoModelForCausalLM.from_pretrained(str(BUNDLED_MODEL), dtype=torch.float32)
    model.load_state_dict(trained)
    model.save_pretrained(tmp_path)
    ours = out / "bundled"
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in tmp_path.iterdir())
    for name in ("config.json", "generation_config.json"):
        assert json.loads((ours / name).read_text()) == json.loads((tmp_path / name).read_text()), name
    theirs, mine = load_file(tmp_path / "model.safetensors"), load_file(ours / "model.safetensors")
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[n], theirs[n]) for n in theirs)


def test_several_files_with_an_index_load_as_the_trained_weights(ranks):
    results, out, _ = ranks
    folder = out / "several_files"
    assert (folder / "model.safetensors.index.json").is_file() and len(list(folder.glob("model-*"))) > 2
    loaded = reference(str(folder))
    trained = results[0]["bundled"]["trained"]
    assert loaded.keys() == trained.keys()
    assert all(torch.equal(loaded[n], trained[n]) for n in trained)


def test_a_tied_model_is_written_with_its_embedding_once(ranks):
    _, out, _ = ranks
    saved = load_file(out / "tied_bf16" / "model.safetensors")
    assert "lm_head.weight" not in saved and "model.embed_tokens.weight" in saved


def test_lora_at_two_ranks_writes_peft_adapter_and_the_merged_model_peft_makes(ranks):
    import peft

    results, out, _ = ranks
    trained = results[0]["lora"]["trained"]
    assert any(bool((t != 0).any()) for n, t in trained.items() if ".lora_B." in n)  # the step moved B
    base = AutoModelForCausalLM.from_pretrained(str(BUNDLED_MODEL), dtype=torch.float32)
    restored = peft.PeftModel.from_pretrained(base, str(out / "lora"))
    restored_params = dict(restored.named_parameters())
    for name, tensor in trained.items():
        assert torch.equal(restored_params[name], tensor), name
    merged = restored.merge_and_unload()
    written = load_file(out / "lora" / "merged" / "model.safetensors")
    expected = merged.state_dict()
    assert written.keys() == expected.keys()
    assert all(torch.equal(written[n], expected[n]) for n in expected)


def test_lora_at_two_ranks_resumes_the_adapter_it_saved(ranks):
    results, _, _ = ranks
    for rank in results:
        resumed, trained = rank["lora_resume"], rank["lora"]["trained"]
        assert resumed["by_rows"]
        assert resumed["loaded"].keys() == trained.keys()
        assert all(torch.equal(resumed["loaded"][n], t) for n, t in trained.items())


def test_a_save_that_fails_on_one_rank_fails_on_every_rank_and_keeps_the_earlier_save(ranks):
    results, out, _ = ranks
    assert "No space left on device" in results[1]["failed_save"]
    assert "rank(s) [1] could not write its rows" in results[0]["failed_save"]
    folder = out / "bundled"
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".partial")]
    saved, trained = reference(str(folder)), results[0]["bundled"]["trained"]
    assert all(torch.equal(saved[n], t) for n, t in trained.items())
