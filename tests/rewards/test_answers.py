import pytest

from forge_nb.rewards import answer_match, boxed, extract_answer, format_match, last_number, to_number


@pytest.mark.parametrize(
    ("completion", "target", "expected"),
    [
        ("So the answer is \\boxed{42}.", "42", 1.0),
        ("17 + 25 = 42.", "42", 1.0),
        ("17 + 25 = 32.", "42", 0.0),  # the last number counts
        ("It costs $1,234.00 in total", "1234", 1.0),
        ("The answer is 5", "5.0", 1.0),
        ("50%", "50", 1.0),
        ("\\boxed{12} but later 13", "12", 1.0),  # a boxed answer wins over later numbers
        ("Paris.", "paris", 1.0),
        ("The capital is Paris", "Paris", 0.0),  # text compares whole (normalised), not by containment
        ("no number here", "5", 0.0),
        ("", "5", 0.0),
    ],
)
def test_answer_match(completion, target, expected):
    assert answer_match(completion, target) == expected


def test_pieces():
    assert boxed("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}" and boxed("none") is None
    assert last_number("x 3, then -4.5") == -4.5 and last_number("none") is None
    assert to_number("$1,000") == 1000.0 and to_number("abc") is None and to_number("inf") is None
    assert extract_answer("first 1 then 2") == "2"
    assert format_match(" 42 ", r"-?\d+") == 1.0 and format_match("42 apples", r"-?\d+") == 0.0
