from forge_nb.config import TaskConfig
from forge_nb.tasks import make_task
from forge_nb.tasks.arithmetic import ALPHABET, Addition, exact_match


def test_prompts_are_seeded_and_answers_exact():
    a, b = Addition(seed=1), Addition(seed=1)
    problems = a.sample(50)
    assert problems == b.sample(50)
    for p in problems:
        left, right = p.prompt.removesuffix("=").split("+")
        assert int(p.target) == int(left) + int(right)
        assert set(p.prompt + p.target) <= set(ALPHABET)


def test_held_out_set_is_fixed_and_never_sampled_for_training():
    task = Addition(seed=0, eval_size=100)
    held = {p.prompt_id for p in task.eval_set()}
    assert len(held) == 100
    assert held == {p.prompt_id for p in Addition(seed=0, eval_size=100).eval_set()}
    assert not held & {p.prompt_id for p in task.sample(2000)}


def test_verifier_is_exact_up_to_surrounding_space():
    assert exact_match(" 42", "42") == 1.0
    assert exact_match("4 2", "42") == 0.0
    assert exact_match("", "42") == 0.0
    assert Addition().verify("420", "42") == 0.0


def test_unknown_task_is_a_clear_error():
    import pytest

    from forge_nb.config import Config, ConfigError

    with pytest.raises(ConfigError, match=r"task.name must be one of \['addition', 'dataset'\], got 'chess'"):
        Config().updated({"task": "chess"})
    with pytest.raises(ValueError, match="task.name: unknown task 'chess'"):
        make_task(TaskConfig(name="chess"), seed=0)
