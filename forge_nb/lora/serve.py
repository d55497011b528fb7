"""Generator side of LoRA: serve a refreshed adapter.

A refresh moves only the adapter's tensors (peft's saved names, `adapter.adapter_tensors`); how they
reach the served model depends on the engine:

- torch engine, ``lora.serve="merged"`` (`MergedAdapter`, the default): merged into the served weights,
  ``W = W0 + scale * B @ A`` for every target, always from a copy of the base ``W0`` taken before the first
  merge, so version v never carries rounding from versions before it. Generation runs at the base's speed;
  a refresh reads and writes every target weight.
- torch engine, ``lora.serve="layer"`` (`LayerAdapter`): the served model carries peft's LoRA layers and a
  refresh copies only the adapter's tensors into them; every forward pays the adapter's extra matmuls.
  `benchmarks/weight_refresh.py --lora` measures both.
- vLLM (`VllmAdapter`): loaded as a LoRA adapter at run time (``enable_lora``; the CPU build supports
  it, punica's CPU kernels), a new adapter id per policy version; the base weights never change.

Either keeps the adapter last loaded (`tensors`, copied out of the refresh's staging buffer): the
checksum the session compares with the trainer's, and what a checkpoint saves as the served adapter.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from forge_nb.config.lora import LoraConfig
from forge_nb.lora.targets import peft_config

ADAPTER_FILE = "adapter_model.safetensors"  # peft's file name: a trainer's saved adapter and a served one
_PREFIX = "base_model.model."


def base_weight_name(adapter_name: str) -> str:
    """``base_model.model.M.lora_A.weight`` -> ``M.weight``: the base weight the adapter pair updates."""
    module = adapter_name.removeprefix(_PREFIX).rsplit(".lora_", 1)[0]
    return f"{module}.weight"


def read_adapter(folder: str | Path) -> dict[str, torch.Tensor]:
    """The adapter tensors saved in `folder` (by the trainer, `adapter.save`, or a generator, `save`)."""
    return load_file(str(Path(folder) / ADAPTER_FILE))


class ServedAdapter:
    """What both engines share: the adapter served now (`tensors`) and its policy version."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.version: int | None = None

    def load(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Serve adapter `version` from `named_tensors` (views that die with the refresh: copied here)."""
        self.tensors = {name: t.clone() for name, t in named_tensors}
        prefixes = getattr(self.engine, "prefixes", None)
        if prefixes is not None:  # the torch engine's kept keys/values belong to the adapter that made them
            prefixes.clear()
        self._serve(version)
        self.version = version

    def _serve(self, version: int) -> None:
        raise NotImplementedError

    def save(self, folder: str | Path) -> None:
        """The served adapter as folder/adapter_model.safetensors (a checkpoint's generator/)."""
        Path(folder).mkdir(parents=True, exist_ok=True)
        save_file(self.tensors, str(Path(folder) / ADAPTER_FILE), metadata={"format": "pt"})


class MergedAdapter(ServedAdapter):
    """torch engine: merges each version into the served weights from an unmerged copy of the base."""

    def __init__(self, engine, scale: float) -> None:
        super().__init__()
        self.engine, self.scale = engine, scale
        self._base: dict[str, torch.Tensor] = {}  # target weights as loaded, copied before the first merge
        self._served: dict[str, torch.Tensor] = {}  # the engine's target weights, written in place

    @torch.no_grad()
    def _serve(self, version: int) -> None:
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for name, t in self.tensors.items():
            pairs.setdefault(base_weight_name(name), {})["A" if ".lora_A." in name else "B"] = t
        if not self._base:  # before any merge the engine holds the base weights
            self._served = {w: t for w, t in self.engine.named_weights() if w in pairs}
            self._base = {w: t.clone() for w, t in self._served.items()}
        scratch: dict[tuple, torch.Tensor] = {}  # one product buffer per weight shape
        for w, ab in pairs.items():
            # W = W0 + scale * B @ A ([out, r] @ [r, in]) into the served tensor, with no new tensor the
            # size of W per target: allocating ~200 of them cost more than the arithmetic (page faults),
            # and addmm's fused form measured slower on the CPU than mm then add.
            served = self._served[w]
            product = scratch.setdefault((served.shape, served.dtype), torch.empty_like(served))
            torch.mm(ab["B"], ab["A"], out=product)
            torch.add(self._base[w], product, alpha=self.scale, out=served)


class VllmAdapter(ServedAdapter):
    """vLLM: each version written as a peft adapter folder (in /dev/shm when there is one: no disk),
    loaded as a LoRA adapter with its own id (the previous one dropped), and the folder deleted: vLLM holds
    the loaded adapter in memory, and with one adapter at a time never evicts it to read it again."""

    def __init__(self, engine, lora: LoraConfig) -> None:
        super().__init__()
        self.engine = engine
        self.config = peft_config(lora)

    def _serve(self, version: int) -> None:
        shm = Path("/dev/shm")
        with tempfile.TemporaryDirectory(prefix="forge_nb-adapter-", dir=shm if shm.is_dir() else None) as folder:
            self.save(folder)
            self.config.save_pretrained(folder)
            self.engine.use_adapter(folder, version)


class LayerAdapter(ServedAdapter):
    """torch engine: the served model gets peft's LoRA layers once; a refresh copies the adapter into them."""

    def __init__(self, engine, lora: LoraConfig) -> None:
        super().__init__()
        import peft

        self.engine = engine

        # peft replaces the target modules inside engine.model, which keeps serving (now with the adapter).
        wrapped = peft.get_peft_model(engine.model, peft_config(lora))
        engine.model.eval()
        self._params = {n.replace(".default.", "."): p for n, p in wrapped.named_parameters() if ".lora_" in n}

    @torch.no_grad()
    def _serve(self, version: int) -> None:
        for name, t in self.tensors.items():
            self._params[name].copy_(t)


def served_adapter(engine, engine_name: str, lora: LoraConfig) -> ServedAdapter:
    """How `engine` (named `engine_name`) serves adapters for `lora` (`lora.serve` for the torch engine)."""
    if engine_name == "vllm":
        return VllmAdapter(engine, lora)
    return LayerAdapter(engine, lora) if lora.serve == "layer" else MergedAdapter(engine, lora.scale)
