import pytest

from forge_nb.live.capture import LiveCodeError, compile_function, definitions, from_source

CELL = """
import math
from collections import Counter as C

SCALE = 2.0
pattern = math.sqrt(SCALE)

def helper(x):
    return x * SCALE

def reward(prompt, completion, target, **context):
    return helper(float(completion == target))

v = s.set_reward(reward)
print(v)
"""


def test_definitions_keep_imports_defs_and_self_contained_assignments_only():
    body = definitions(CELL, "cell")
    assert "import math" in body and "from collections import Counter as C" in body
    assert "SCALE = 2.0" in body and "pattern = math.sqrt(SCALE)" in body
    assert "def helper" in body and "def reward" in body
    assert "set_reward" not in body and "print" not in body


def test_from_source_picks_the_last_function_and_compiles_with_its_helpers():
    code = from_source("reward", CELL)
    assert code.name == "reward"
    fn = compile_function(code)
    assert fn("1+1=", "2", "2") == 2.0 and fn("1+1=", "3", "2") == 0.0


def test_syntax_error_names_the_line():
    with pytest.raises(LiveCodeError, match=r"line 2: SyntaxError"):
        from_source("reward", "def reward(p, c, t):\n    return (\n")


def test_a_cell_without_a_function_is_refused():
    with pytest.raises(LiveCodeError, match="the cell defines no function"):
        from_source("loss", "x = 1\n")


def test_a_cell_that_starts_the_session_keeps_only_its_definitions():
    cell = (
        "import forge_nb\nfrom forge_nb.rewards import answer_match\n\n"
        "s = forge_nb.up(engine='torch')\nLIMIT = 3\nok = answer_match\n\n"
        "def reward(prompt, completion, target, **context):\n    return ok(completion, target) * LIMIT\n"
    )
    body = from_source("reward", cell).source
    assert "forge_nb.up" not in body and "LIMIT = 3" in body and "ok = answer_match" in body
    assert compile_function(from_source("reward", cell))("p", "42", "42") == 3.0


def test_forge_decorators_are_dropped_and_others_kept():
    cell = (
        "import functools\nimport forge_nb\n\n"
        "@forge_nb.reward\n@functools.lru_cache(maxsize=None)\n"
        "def reward(prompt, completion, target, **context):\n    return 1.0\n"
    )
    body = from_source("reward", cell).source
    assert "@forge_nb.reward" not in body
    assert "@functools.lru_cache(maxsize=None)" in body
    assert compile_function(from_source("reward", cell))("p", "c", "t") == 1.0
