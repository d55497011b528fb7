"""Held-out accuracy's standard error: over prompts, each prompt's share correct one observation."""

import math
from types import SimpleNamespace

import pytest

from forge_nb.evaluation import per_prompt, standard_error


def test_the_standard_error_is_the_sample_std_over_root_n():
    assert standard_error([1.0, 0.0, 1.0, 0.0]) == pytest.approx(math.sqrt(1 / 3 / 4))
    assert math.isnan(standard_error([1.0]))


def test_samples_of_one_prompt_are_one_observation():
    episodes = [SimpleNamespace(prompt_id=p) for p in ("a", "a", "b", "b", "c", "c")]
    assert per_prompt(episodes, [1, 0, 1, 1, 0, 0]) == [0.5, 1.0, 0.0]
