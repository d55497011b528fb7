"""Generation engines behind one interface (`base.Engine`): vLLM wherever it is installed, plain
PyTorch for tests and machines without vLLM."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from forge_nb.engines.vllm_engine import vllm_available

ENGINE_ENV = "FORGE_NB_ENGINE"  # overrides engine.name="auto" (the test suite sets it to "torch")


def resolve_engine_name(name: str) -> str:
    """ "auto" -> $FORGE_NB_ENGINE if set, else "vllm" when vLLM is installed, else "torch"."""
    if name != "auto":
        return name
    return os.environ.get(ENGINE_ENV) or ("vllm" if vllm_available() else "torch")


def load_engine(name: str, model_dir: str | Path, dtype: torch.dtype, **vllm_options):
    """Start engine `name` ("torch" or "vllm") serving `model_dir` in `dtype`."""
    if name == "vllm":
        from forge_nb.engines.vllm_engine import VllmEngine

        return VllmEngine.load(model_dir, dtype, **vllm_options)
    from forge_nb.engines.torch_engine import TorchEngine

    return TorchEngine.load(model_dir, dtype)
