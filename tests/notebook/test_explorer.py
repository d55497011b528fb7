"""The explorer's turn table: a trajectory's turns, and where a new segment starts and why."""

import json

from forge_nb.notebook.explorer import _turns_html


def turn(text: str, segment: int = 0, why: str | None = None) -> dict:
    return {
        "text": text,
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "finish_reason": "stop",
        "reward": 0.0,
        "tool_calls": 0,
        "tool_errors": 0,
        "segment": segment,
        "new_segment": why,
    }


def test_a_turn_that_starts_a_new_segment_says_why_above_it():
    html = _turns_html(json.dumps([turn("6*7"), turn("42", 1, "the tools changed")]))
    assert html.count("<tr>") == 4 and "new segment: the tools changed" in html
    assert html.index("new segment") < html.index("42")


def test_turns_logged_before_segments_existed_still_show():
    old = [{k: v for k, v in turn("hi").items() if k not in ("segment", "new_segment")}]
    assert "new segment" not in _turns_html(json.dumps(old)) and "hi" in _turns_html(json.dumps(old))
