"""Turn a GGUF file into a Hugging Face model directory (float32 safetensors + tokenizer), once.

`transformers` reads GGUF (de-quantising to float32) but refuses to `save_pretrained` a model it
loaded that way; a model built from the same config without `quantization_config`, given the state
dict, saves normally. The directory is written under a temporary name and renamed into place, under
a file lock, so concurrent processes (a kernel, a test, a benchmark) build it once and never see it
half-written.
"""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

import torch
from tqdm.auto import tqdm

STAGES = ("reading and de-quantising the GGUF file", "saving safetensors and tokenizer")


def materialise_gguf(gguf_dir: Path, filename: str, out: Path) -> Path:
    """Write `gguf_dir/filename` as an HF directory at `out` (unless another process did) -> `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "config.json").is_file():
            return out
        staging = out.parent / f".{out.name}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        with tqdm(total=len(STAGES), desc=f"forge_nb: materialising {out.name} (once)", leave=False) as bar:
            bar.set_postfix_str(STAGES[0])
            model, tokenizer = _load(gguf_dir, filename)
            bar.update()
            bar.set_postfix_str(STAGES[1])
            model.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)
            bar.update()
        staging.rename(out)
    return out


def _load(gguf_dir: Path, filename: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=filename)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=filename, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.tie_weights()
    return model.eval(), tokenizer
