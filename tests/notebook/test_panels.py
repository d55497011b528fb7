"""Which panels the dashboard and its picture show: those the run has data for."""

import math

from forge_nb.notebook.panels import REAL_BYTES, eval_row, shown

NAN = math.nan


def step(n: int, **values) -> dict:
    row = {
        "kind": "step",
        "step": n,
        "mean_reward": 0.5,
        "accuracy": 0.5,
        "tokens_per_s": 900.0,
        "generate_s": 0.2,
        "score_s": 0.01,
        "reference_s": 0.0,
        "train_s": 0.3,
        "refresh_s": 0.01,
        "refresh_gbps": 0.2,
        "refresh_bytes": 1_700_000,
        "turns": NAN,
        "tool_calls": NAN,
        "tool_errors": NAN,
        "entropy": 1.2,
        "clip_fraction": 0.0,
        "kl_ref": NAN,
        "response_length": 12.0,
        "response_length_max": 16,
    }
    return {**row, **values}


def titles(rows: dict) -> dict[str, tuple[str, ...]]:
    return {p.title: p.series for p in shown(rows)}


def test_a_plain_run_shows_no_judge_agent_kl_refresh_or_empty_phase():
    got = titles({"step": [step(1), step(2)]})
    assert list(got) == [
        "reward (= task accuracy)",
        "generated tokens/s",
        "time per phase",
        "policy entropy",
        "response length",
    ]  # on-policy nothing is clipped: no clip fraction panel (a line on its axis)
    assert "clip fraction" in titles({"step": [step(1), step(2, clip_fraction=0.03)]})
    assert got["reward (= task accuracy)"] == ("mean_reward",)
    assert got["time per phase"] == ("generate_s", "score_s", "train_s", "refresh_s")  # no reference ran


def test_each_panel_appears_with_its_data():
    rows = {
        "step": [
            step(
                1,
                accuracy=0.25,
                refresh_bytes=REAL_BYTES,
                refresh_gbps=3.0,
                kl_ref=0.01,
                turns=2.0,
                tool_calls=3,
                tool_errors=0,
                reference_s=0.1,
            )
        ],
        "judge": [{"kind": "judge", "step": 1, "verdicts_per_s": 4.0, "latency_s": 0.5}],
        "eval": [eval_row({"kind": "eval", "step": n, "heldout_accuracy": 0.3, "eval_greedy": 1.0}) for n in (0, 1)],
    }
    got = titles(rows)
    assert got["reward and task accuracy"] == ("mean_reward", "accuracy")
    assert got["held-out accuracy"] == ("heldout_greedy",)
    assert got["refresh bandwidth"] == ("refresh_gbps",)
    assert got["judge verdicts/s"] == ("verdicts_per_s",) and "judge latency per call" in got
    assert got["agent: model calls per trajectory"] == ("turns",)
    assert got["agent: tool calls per step"] == ("tool_calls",)  # no tool failed: no errors line
    assert got["KL to the reference (k3)"] == ("kl_ref",)
    assert "reference_s" in got["time per phase"]


def test_before_the_first_step_the_reward_and_throughput_panels_wait():
    assert list(titles({"step": []})) == ["reward and task accuracy", "generated tokens/s"]


def test_rows_from_before_a_column_existed_draw_without_it():
    old = {"kind": "step", "step": 1, "mean_reward": 0.2, "accuracy": 0.2, "tokens_per_s": 10.0, "train_s": 0.1}
    assert list(titles({"step": [old]})) == ["reward (= task accuracy)", "generated tokens/s", "time per phase"]


def test_held_out_accuracy_is_a_curve_of_two_evaluations_or_more_greedy_and_sampled_apart():
    def evaluation(n: int, greedy: bool) -> dict:
        return eval_row({"kind": "eval", "step": n, "heldout_accuracy": 0.3, "eval_greedy": float(greedy)})

    one_step = {"step": [step(1)], "eval": [evaluation(0, True), evaluation(0, False)]}
    assert "held-out accuracy" not in titles(one_step)
    two_steps = {"step": [step(1)], "eval": [evaluation(0, True), evaluation(0, False), evaluation(10, False)]}
    assert titles(two_steps)["held-out accuracy"] == ("heldout_greedy", "heldout_sampled")
