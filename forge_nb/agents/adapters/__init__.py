"""Adapters running external environment packages unchanged through `agents.runner`."""
