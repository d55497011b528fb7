"""Rewards: answer checks to use in reward cells (`answers`), and what a reward is called on and
returns (`batch`)."""

from forge_nb.rewards.answers import answer_match, boxed, extract_answer, format_match, last_number, to_number

__all__ = ["answer_match", "boxed", "extract_answer", "format_match", "last_number", "to_number"]
