"""Programs that run forge_nb without a notebook; `run.py` is copied verbatim into every export."""
