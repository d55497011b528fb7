"""Generation engines behind one interface (`base.Engine`): vLLM and plain PyTorch.

``engine.name="auto"`` takes whichever is faster where it runs, as `benchmarks/engines.py` measures it:
vLLM on a GPU; on a CPU vLLM for real models and the torch engine for small ones, whose generation vLLM's
per-request scheduling in Python makes slower (the line is 256 MB of weights, ~64M float32 parameters; the
benchmarks page has the numbers); without vLLM, the torch engine. ``FORGE_NB_ENGINE`` in the environment says
what "auto" means for every session of that environment (e.g. ``torch`` where vLLM is installed but its start-up
is not worth it for the runs at hand); an explicit ``engine.name`` wins over it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from forge_nb.engines.vllm_engine import vllm_available

ENGINE_ENV = "FORGE_NB_ENGINE"  # what engine.name="auto" means in this environment, when set


CPU_VLLM_MIN_BYTES = 256 << 20  # on a CPU, vLLM for models with at least this many bytes of weights


def resolve_engine_name(name: str, model_dir: str | Path | None = None) -> str:
    """ "auto" -> $FORGE_NB_ENGINE if set; else "vllm" if it is installed and there is a GPU or the model
    in `model_dir` has at least `CPU_VLLM_MIN_BYTES` of weights; else "torch"."""
    if name != "auto":
        return name
    if os.environ.get(ENGINE_ENV):
        return os.environ[ENGINE_ENV]
    if not vllm_available():
        return "torch"
    if torch.cuda.is_available():
        return "vllm"
    return "vllm" if model_dir is not None and weights_bytes(Path(model_dir)) >= CPU_VLLM_MIN_BYTES else "torch"


def weights_bytes(model_dir: Path) -> int:
    """Bytes of the weight files (safetensors, bin) in an HF model directory."""
    return sum(f.stat().st_size for pattern in ("*.safetensors", "*.bin") for f in model_dir.glob(pattern))


def load_engine(name: str, model_dir: str | Path, dtype: torch.dtype, device: str = "cpu", **vllm_options):
    """Start engine `name` ("torch" or "vllm") serving `model_dir` in `dtype`; the torch engine on `device`
    ("cpu", "cuda", "auto"), vLLM on the device its build is for."""
    if name == "vllm":
        from forge_nb.engines.vllm_engine import VllmEngine

        return VllmEngine.load(model_dir, dtype, **vllm_options)
    from forge_nb.engines.torch_engine import TorchEngine

    return TorchEngine.load(model_dir, dtype, device)
