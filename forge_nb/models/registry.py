"""Models by name: `model.path` is a registered name or any Hugging Face causal-LM directory."""

from __future__ import annotations

from pathlib import Path

#: The small model committed with the package (rebuild: ``python -m forge_nb.tools.bundled_model OUT_DIR``).
BUNDLED_MODEL = Path(__file__).parent / "bundled"

MODELS = {"bundled": BUNDLED_MODEL}


def resolve_model(path: str) -> Path:
    """A registered model's directory, or `path` itself (``~`` expanded)."""
    if path in MODELS:
        return MODELS[path]
    return Path(path).expanduser()
