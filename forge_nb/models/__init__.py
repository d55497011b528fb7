"""Models: the bundled one (committed data) and the registry of names `model.path` accepts."""

from forge_nb.models.registry import BUNDLED_MODEL, MODELS, ModelError, check_model, resolve_model

__all__ = ["BUNDLED_MODEL", "MODELS", "ModelError", "check_model", "resolve_model"]
