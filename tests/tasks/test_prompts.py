"""Prompt formats: chat messages through the chat template, strings raw, lengths checked before start."""

import string

import pytest

from forge_nb.tasks.base import Problem
from forge_nb.tasks.prompts import PromptError, PromptFormat, check_lengths
from forge_nb.tools.char_tokenizer import build_tokenizer

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    tok = build_tokenizer(string.ascii_letters + string.digits + " <>?+=\n")
    tok.chat_template = TEMPLATE
    return tok


def test_messages_go_through_the_chat_template_with_the_generation_prompt(tokenizer):
    problem = Problem("q1", [{"role": "user", "content": "What is 2+2?"}], "4")
    text, ids = PromptFormat(tokenizer).render(problem)
    assert text == "<user>What is 2+2?\n<assistant>"
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]  # no BOS added to a template's text
    assert tokenizer.bos_token_id not in ids


def test_a_system_prompt_comes_first_unless_the_messages_have_one(tokenizer):
    prompts = PromptFormat(tokenizer, system_prompt="Be brief")
    text, _ = prompts.render(Problem("a", [{"role": "user", "content": "hi"}], "x"))
    assert text == "<system>Be brief\n<user>hi\n<assistant>"
    own = [{"role": "system", "content": "Mine"}, {"role": "user", "content": "hi"}]
    assert prompts.render(Problem("b", own, "x"))[0] == "<system>Mine\n<user>hi\n<assistant>"


def test_strings_stay_raw_unless_the_format_is_chat(tokenizer):
    raw = PromptFormat(tokenizer).render(Problem("s", "12+34=", "46"))
    assert raw == ("12+34=", tokenizer("12+34=")["input_ids"])  # as a base model's tokenizer encodes it
    chat, _ = PromptFormat(tokenizer, style="chat").render(Problem("s", "12+34=", "46"))
    assert chat == "<user>12+34=\n<assistant>"


def test_a_batch_renders_as_each_prompt_alone_strings_and_messages_mixed(tokenizer):
    problems = [
        Problem("s1", "12+34=", "46"),
        Problem("m1", [{"role": "user", "content": "What is 2+2?"}], "4"),
        Problem("s1", "12+34=", "46"),  # the same prompt twice in one batch
        Problem("s2", "7+8=", "15"),
    ]
    prompts = PromptFormat(tokenizer)
    texts, ids = prompts.render_all(problems)
    alone = [PromptFormat(tokenizer).render(p) for p in problems]
    assert list(zip(texts, ids)) == alone
    assert prompts.render_all(problems[1:2]) == ([alone[1][0]], [alone[1][1]])  # remembered by prompt id


def test_messages_with_a_raw_format_or_without_a_template_are_refused(tokenizer):
    messages = Problem("m", [{"role": "user", "content": "hi"}], "x")
    with pytest.raises(PromptError, match="prompt m: chat messages, but task.prompt_format='raw'"):
        PromptFormat(tokenizer, style="raw").render(messages)
    plain = build_tokenizer("abc")
    with pytest.raises(PromptError, match="the model's tokenizer has no chat template"):
        PromptFormat(plain).render(messages)


def test_a_prompt_too_long_for_the_context_names_itself(tokenizer):
    problems = [Problem("short", "1+1=", "2"), Problem("long", "9" * 50, "9")]
    check_lengths(problems[:1], PromptFormat(tokenizer), context=64, max_tokens=8)
    with pytest.raises(
        PromptError,
        match=r"prompt long is 51 tokens; with engine.max_tokens=16 that exceeds the "
        r"model's context of 64 tokens",
    ):
        check_lengths(problems, PromptFormat(tokenizer), context=64, max_tokens=16)
