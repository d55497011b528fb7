"""The judge reward without a mesh: templates, parsers, the checks `judge()` makes, calls through
the judge client, and the judge model itself (the bundled model stands in for a real judge)."""

import threading
import time

import pytest
import torch

import forge_nb.rewards.judge_client as judge_client
from forge_nb.live.deadline import wait_for
from forge_nb.models import BUNDLED_MODEL, ModelError
from forge_nb.rewards import judge
from forge_nb.rewards.judge import parse_score, parse_yes_no, render
from forge_nb.rewards.judge_client import JudgeNotRunning, JudgeUnavailable
from forge_nb.rewards.judge_model import JudgeModel
from forge_nb.rewards.verdicts import JudgeAnswer, JudgeRequest

CHAT_PROMPT = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
)


def test_the_template_reads_the_question_completion_and_any_column():
    columns = {"prompts": [CHAT_PROMPT], "completions": ["4"], "targets": ["4"], "level": ["easy"]}
    assert render("{question} -> {completion} ({level})", columns) == ["What is 2+2? -> 4 (easy)"]
    assert render("{prompt}|{target}", columns) == [CHAT_PROMPT + "|4"]


def test_a_template_field_that_is_not_a_column_says_so():
    with pytest.raises(KeyError, match=r"reads \{target\}.*Ensemble hides the targets"):
        render("{target}", {"prompts": ["p"], "completions": ["c"]})


def test_parsers():
    assert parse_score("Score: 8/10") == 0.8 and parse_score("15") == 1.0 and parse_score("none") is None
    assert parse_yes_no("Yes, it is.") == 1.0 and parse_yes_no("No.") == 0.0 and parse_yes_no("Not correct") == 0.0
    assert parse_yes_no("maybe") is None


def test_judge_checks_its_arguments_where_it_is_written():
    with pytest.raises(ModelError, match="neither a model name"):
        judge(model="no-such-model")
    with pytest.raises(ValueError, match="parser must be one of"):
        judge(parser="stars")
    with pytest.raises(TypeError, match="unknown options"):
        judge(temperature=0.5)
    with pytest.raises(ValueError, match="judge template"):
        judge(template="{unclosed")


class _FakeJudge:
    """A judge actor stand-in: `verdicts.call_one(request).get(timeout)`, answering after `delay` s."""

    def __init__(self, delay=0.0, texts=None):
        self.delay, self.texts, self.requests = delay, texts, []
        self.verdicts = self

    def call_one(self, request):
        self.requests.append(request)
        return self

    def get(self, timeout=None):
        time.sleep(self.delay)
        request = self.requests[-1]
        if request.mode == "choice":
            return JudgeAnswer([0.25] * len(request), None, self.delay, 10)
        return JudgeAnswer(None, self.texts or ["Yes"] * len(request), self.delay, 12)


@pytest.fixture
def fake_judge():
    fake = _FakeJudge()
    judge_client.attach({"bundled": fake})
    yield fake
    judge_client._handles.clear()


def test_a_judge_asks_for_the_whole_batch_at_once(fake_judge):
    before = judge_client.stats()
    scores = judge(model="bundled", batch_size=4)(["1+1=", "2+2="], ["2", "5"], targets=["2", "4"])
    assert scores == [0.25, 0.25] and len(fake_judge.requests) == 1
    request = fake_judge.requests[0]
    assert request.mode == "choice" and request.batch_size == 4 and "Proposed answer: 5" in request.messages[1]
    traffic = judge_client.stats() - before
    assert (traffic.calls, traffic.verdicts, traffic.tokens) == (1, 2, 10)


def test_a_generating_judge_parses_its_text(fake_judge):
    fake_judge.texts = ["7/10", "nonsense"]
    assert judge(model="bundled", parser="score", unparsed=0.1)(["p", "q"], ["a", "b"]) == [0.7, 0.1]


def test_no_judge_actor_is_a_clear_error():
    with pytest.raises(JudgeNotRunning, match="judge 'bundled' not running"):
        judge(model="bundled")(["p"], ["c"])


def test_a_judge_that_does_not_answer_in_time_is_unavailable():
    judge_client.attach({"bundled": _TimesOut()})
    try:
        with pytest.raises(JudgeUnavailable, match="timed out"):
            judge(model="bundled", timeout_s=0.1)(["p"], ["c"])
    finally:
        judge_client._handles.clear()


class _TimesOut(_FakeJudge):
    def get(self, timeout=None):
        raise TimeoutError


def test_time_waiting_on_a_judge_does_not_count_against_a_reward_timeout():
    slow = _FakeJudge(delay=0.6)
    judge_client.attach({"bundled": slow})
    try:
        done = threading.Event()

        def reward():
            judge(model="bundled")(["p"], ["c"])  # 0.6 s in the judge, ~0 s of its own
            done.set()

        threading.Thread(target=reward, daemon=True).start()
        assert wait_for(done, 0.3)
        spin = threading.Event()
        assert not wait_for(spin, 0.2)  # its own time still counts
    finally:
        judge_client._handles.clear()


def test_the_judge_model_reads_choices_and_generates():
    model = JudgeModel.load(BUNDLED_MODEL)  # char-level, no chat template: messages go in raw
    answer = model.answer(JudgeRequest(["1+1=", "3+4=", "22+3="], "choice", ("2", "9"), batch_size=2))
    assert len(answer.probabilities) == 3 and all(0 <= p <= 1 for p in answer.probabilities)
    assert answer.probabilities[0] > 0.5 > answer.probabilities[1] or answer.probabilities[0] > 0.5
    texts = model.answer(JudgeRequest(["1+1=", "22+3="], "generate", max_tokens=4)).texts
    assert texts[0].startswith("2") and answer.tokens > 0
    with pytest.raises(ValueError, match="no first token of their own"):
        model.choice_tokens(("Yes", "No"))


def test_a_verdict_reads_the_last_position_of_each_left_padded_message():
    model = JudgeModel.load(BUNDLED_MODEL)
    ids = [model.tokenizer(text)["input_ids"] for text in ("12+35=", "1+1=")]
    last = model._last_logits(ids)  # one forward pass, the shorter message left-padded, the LM head on one position
    for row, prompt in enumerate(ids):
        alone = model.model(input_ids=torch.tensor([prompt])).logits[0, -1]
        assert torch.allclose(last[row], alone, atol=1e-4)
