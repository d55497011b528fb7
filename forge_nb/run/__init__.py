"""The run directory: checkpoints (and, beside them, what a run leaves on disk)."""
