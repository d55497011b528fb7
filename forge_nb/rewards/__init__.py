"""Rewards: answer checks to use in reward cells (`answers`), what a reward is called on and returns
(`batch`, `forms`), scoring a batch with the live reward set every step (`scoring`), a model judge
(`judge`), weak verifiers for the bundled tasks (`verifiers`) and an ensemble that combines them
without labels (`ensemble`, fitted by `weaver`), and TRL's reward_funcs as a live reward set
(`reward_funcs`; TRL's call form: `trl_form`)."""

from forge_nb.rewards.answers import answer_match, boxed, extract_answer, format_match, last_number, to_number
from forge_nb.rewards.ensemble import Ensemble
from forge_nb.rewards.judge import Judge, judge
from forge_nb.rewards.reward_funcs import set_reward_funcs
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
    "set_reward_funcs",
    "to_number",
]
