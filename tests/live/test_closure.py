"""Capturing a function (or a callable object) from a script or cell: exactly what it needs, nothing that acts."""

import runpy
import sys
import textwrap

import pytest

from forge_nb.live.capture import LiveCodeError, compile_function
from forge_nb.live.closure import capture_callable

SCRIPT = """
import math
import re

import forge_nb
from forge_nb.rewards import answer_match

class Session:  # stands for the session a script starts with forge_nb.up()
    pass

s = Session()
s.started = True
NUMBER = re.compile(r"-?\\d+")
BONUS = {"easy": 0.5, "hard": 1.0}

def last_number(text):
    found = NUMBER.findall(text)
    return found[-1] if found else None

def good(prompt, completion, target, level="easy"):
    return float(last_number(completion) == target) + BONUS[level] + math.floor(0.5)

try:
    def guarded(prompt, completion, target):
        return float(completion.strip().startswith(target))
except Exception:
    pass

def make_scaled(scale):
    def scaled(prompt, completion, target):
        return scale * answer_match(completion, target)
    return scaled

class Shaped:
    def __init__(self, weight):
        self.weight = weight
        self.pattern = r"\\d+"

    def __call__(self, prompt, completion, target, **context):
        return self.weight * float(re.search(self.pattern, completion) is not None)

@forge_nb.reward if False else (lambda f: f)
def plain(prompt, completion, target):
    return 1.0

def uses_session(prompt, completion, target):
    return float(s.started)
"""


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("script") / "train.py"
    path.write_text(SCRIPT)
    return runpy.run_path(str(path), run_name="__main__")  # functions of __main__, as a user's script has


def test_a_script_function_travels_with_its_helpers_constants_and_regex_but_not_the_session(script):
    code = capture_callable("reward", script["good"])
    assert code.name == "good" and code.origin == "train.py:20"
    assert "def last_number" in code.source and "BONUS = {'easy': 0.5, 'hard': 1.0}" in code.source
    assert "NUMBER = __import__('re').compile(" in code.source and "import math" in code.source
    assert "forge_nb.up" not in code.source and "Session" not in code.source and "s.started" not in code.source
    fn = compile_function(code)
    assert fn("p", "so 7 + 5 = 12", "12") == 1.5 and fn("p", "13", "12", level="hard") == 1.0


def test_a_function_defined_in_a_try_block_travels_alone(script):
    code = capture_callable("reward", script["guarded"])
    assert code.source.strip().startswith("def guarded") and compile_function(code)("p", "42!", "42") == 1.0


def test_a_closure_takes_the_values_of_the_variables_it_reads(script):
    code = capture_callable("reward", script["make_scaled"](0.25))
    assert "scale = 0.25" in code.source and "from forge_nb.rewards.answers import answer_match" in code.source
    assert compile_function(code)("p", "it is 9", "9") == 0.25


def test_a_callable_object_travels_as_its_class_and_attributes(script):
    code = capture_callable("reward", script["Shaped"](0.5))
    assert code.name == "shaped" and "class Shaped" in code.source
    assert "'weight': 0.5" in code.source
    assert compile_function(code)("p", "42", "42") == 0.5


def test_a_name_that_cannot_travel_is_a_clear_error(script):
    with pytest.raises(LiveCodeError, match=r"the global 's' that 'uses_session' reads is a Session .* cannot travel"):
        capture_callable("reward", script["uses_session"])


def test_a_lambda_travels_as_an_assignment():
    limit = 3
    code = capture_callable("reward", lambda prompt, completion, target, **ctx: float(len(completion) < limit))
    assert code.name == "reward" and code.source.splitlines()[-1].startswith("reward = lambda prompt")
    assert "limit = 3" in code.source and compile_function(code)("p", "ab", "t") == 1.0


def test_a_function_from_an_importable_module_travels_by_reference(tmp_path, monkeypatch):
    (tmp_path / "team_rewards.py").write_text(
        textwrap.dedent("""
        import re

        DIGITS = re.compile(r"\\d+")

        def accuracy(prompt, completion, target, **context):
            found = DIGITS.findall(completion)
            return float(bool(found) and found[-1] == target)
        """)
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    import team_rewards

    code = capture_callable("reward", team_rewards.accuracy)
    assert code.source.strip() == "from team_rewards import accuracy"
    assert code.paths == (str(tmp_path),) and code.reload == ("team_rewards",)
    assert compile_function(code)("p", "7 and 8", "8") == 1.0
    sys.modules.pop("team_rewards", None)
