"""Rewards: answer checks to use in reward cells (`answers`), what a reward is called on and returns
(`batch`, `forms`), scoring a batch with the live reward set every step (`scoring`), a model judge
(`judge`), weak verifiers for the bundled tasks (`verifiers`) and an ensemble that combines them
without labels (`ensemble`, fitted by `weaver`)."""

from forge_nb.rewards.answers import answer_match, boxed, extract_answer, format_match, last_number, to_number
from forge_nb.rewards.ensemble import Ensemble
from forge_nb.rewards.judge import Judge, judge
from forge_nb.rewards.verifiers import addition_verifiers, agreement, numeric_verifiers

__all__ = [
    "Ensemble",
    "Judge",
    "addition_verifiers",
    "agreement",
    "answer_match",
    "boxed",
    "extract_answer",
    "format_match",
    "judge",
    "last_number",
    "numeric_verifiers",
    "to_number",
]
