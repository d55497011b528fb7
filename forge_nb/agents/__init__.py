"""Multi-turn agent rollouts: tools, an OpenAI-style client over forge_nb's generator, trajectories
with exact token ids and loss masks, and a runner for agent loops and environments.

Pure Python + torch + transformers + `openai` types (no Monarch): testable without a mesh.
"""
