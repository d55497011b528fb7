"""Weak verifiers of the bundled tasks: each vote by hand, and none reads a label."""

import inspect

import pytest

from forge_nb.rewards import addition_verifiers, agreement, numeric_verifiers
from forge_nb.rewards.forms import is_batched
from forge_nb.rewards.verifiers import (
    casting_out_nines,
    digit_count,
    digits_only,
    from_operands,
    last_digit,
    magnitude,
    not_an_operand,
    number_only,
    whole_number,
)


@pytest.mark.parametrize(
    ("completion", "votes"),  # digits_only, digit_count, last_digit, casting_out_nines, magnitude
    [
        ("432", (1, 1, 1, 1, 1)),  # the sum of 47 + 385
        ("433", (1, 1, 0, 0, 1)),  # off by one: both residues catch it
        ("442", (1, 1, 1, 0, 1)),  # off by ten: the last digit cannot see it, nines can
        ("522", (1, 1, 1, 1, 1)),  # off by 90: every check passes it (what the ensemble cannot see)
        ("342", (1, 1, 1, 1, 0)),  # digits swapped: residues kept, too small
        ("0432", (0, 1, 1, 1, 1)),  # a leading zero is a format error
        ("4320", (1, 1, 0, 1, 0)),
        ("forty", (0, 0, 0, 0, 0)),
    ],
)
def test_addition_votes_by_hand(completion, votes):
    checks = (digits_only, digit_count, last_digit, casting_out_nines, magnitude)
    assert tuple(check("47+385=", completion) for check in checks) == votes


def test_addition_checks_abstain_on_a_prompt_that_is_not_a_sum():
    assert [check("What is 4 times 5?", "20") for check in (digit_count, last_digit, magnitude)] == [None] * 3


def test_a_chat_wrapped_sum_is_read_from_the_user_turn():
    prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n12+30=<|im_end|>\n<|im_start|>assistant\n"
    assert last_digit(prompt, "42") == 1.0 and magnitude(prompt, "42") == 1.0


def test_agreement_votes_for_the_majority_answer_of_each_prompt():
    prompts = ["1+1="] * 4 + ["2+2="] * 3 + ["3+3="]
    completions = ["2", "2", "3", "2", "4", "5", "6", "6"]
    ids = ["a"] * 4 + ["b"] * 3 + ["c"]
    assert agreement(prompts, completions, ids) == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, None]


def test_numeric_votes_on_a_word_problem():
    question = "Ana has 12 apples. Ana gets 5 more. How many apples does Ana have now? Answer with the number only."
    assert [check(question, "17") for check in (number_only, whole_number, from_operands, not_an_operand)] == [1] * 4
    assert not_an_operand(question, "12") == 0.0 and from_operands(question, "23") == 0.0
    assert number_only(question, "Ana has 17 apples.") == 0.0 and whole_number(question, "8.5") == 0.0


def test_no_verifier_takes_the_label():
    for verifier in {*addition_verifiers(), *numeric_verifiers()}:
        names = set(inspect.signature(verifier).parameters)
        assert not names & {"target", "targets"}, verifier.__name__
    assert is_batched(agreement) and not is_batched(digits_only)
