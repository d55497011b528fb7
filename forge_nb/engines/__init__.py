"""Generation engines behind one interface (`base.Engine`): vLLM and plain PyTorch.

``engine.name="auto"`` takes whichever is faster where it runs, as `benchmarks/engines.py` measures it:
vLLM on a GPU; on a CPU vLLM for real models and the torch engine for small ones. Measured on 2 cores
(generated tokens/s, vLLM / torch): the bundled 0.4M-parameter model 0.22-0.31x (vLLM's per-request
scheduling in Python costs more than the matmuls), a random 109M Llama at 16 new tokens 0.85-1.03x,
SmolLM2-135M-Instruct at 48 new tokens 1.23-1.34x. Hence the line at 256 MB of weights (~64M float32
parameters); below it, or without vLLM, the torch engine.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from forge_nb.engines.vllm_engine import vllm_available

ENGINE_ENV = "FORGE_NB_ENGINE"  # overrides engine.name="auto" (the test suite sets it to "torch")


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
