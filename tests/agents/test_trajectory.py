import copy

import pytest

from forge_nb.agents.tool_calls import render
from forge_nb.agents.trajectory import TemplateRewriteError, Trajectory, Turn, next_prompt_ids


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_token_ids_mask_and_logprobs_are_aligned_turn_by_turn():
    t = Trajectory(row={"q": 1})
    t.turns.append(Turn([1, 2, 3], [4, 5], [-0.1, -0.2], "ab", "stop", reward=0.5, tool_calls=1, tool_errors=1))
    t.turns.append(Turn([6], [7, 8, 9], [-0.3, -0.4, -0.5], "cde", "length"))
    t.reward = 1.0
    assert t.token_ids() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert t.loss_mask() == [0, 0, 0, 1, 1, 0, 1, 1, 1]
    assert t.logprobs() == [0.0, 0.0, 0.0, -0.1, -0.2, 0.0, -0.3, -0.4, -0.5]
    assert t.prompt_ids == [1, 2, 3] and t.completion_ids() == [4, 5, 6, 7, 8, 9]
    assert t.completion_mask() == [1, 1, 0, 1, 1, 1]
    assert t.last_prompt_ids() == [1, 2, 3, 4, 5, 6]
    assert t.turn_rewards == [0.5, 0.0] and t.total_reward == 1.5
    assert (t.num_turns, t.num_tokens, t.tool_calls, t.tool_errors) == (2, 9, 1, 1)
    t.add_reward(0.25)
    assert t.turns[-1].reward == 0.25


def test_next_prompt_is_previous_plus_generated_plus_only_the_new_messages_text(tokenizer):
    history = [{"role": "user", "content": "Guess a number."}]
    prompt = encode(tokenizer, render(tokenizer, history))
    generated = encode(tokenizer, "7") + [tokenizer.eos_token_id]  # the model stops at <|im_end|>
    new = [{"role": "user", "content": "Higher."}]
    ids, delta = next_prompt_ids(tokenizer, prompt, generated, history, new)
    assert ids[: len(prompt) + len(generated)] == prompt + generated  # nothing earlier re-tokenised
    assert tokenizer.decode(delta) == "\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n"
    whole = render(tokenizer, [*history, {"role": "assistant", "content": "7"}, *new])
    assert tokenizer.decode(ids) == whole


def test_a_reply_cut_at_max_tokens_gets_the_end_of_turn_marker_as_masked_glue(tokenizer):
    history = [{"role": "user", "content": "Count."}]
    prompt = encode(tokenizer, render(tokenizer, history))
    cut = encode(tokenizer, "one two")  # no EOS: cut by max_tokens
    _, delta = next_prompt_ids(tokenizer, prompt, cut, history, [{"role": "user", "content": "Go on."}])
    assert tokenizer.decode(delta).startswith("<|im_end|>\n<|im_start|>user\nGo on.")


def test_a_template_that_rewrites_earlier_turns_is_refused(tokenizer):
    rewriting = copy.copy(tokenizer)
    # Shows only the last message's content in full: earlier turns change when new ones arrive.
    rewriting.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if loop.last %}{{ m['content'] }}{% else %}...{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    history = [{"role": "user", "content": "Hi."}]
    prompt = encode(rewriting, render(rewriting, history))
    with pytest.raises(TemplateRewriteError, match="renders the earlier turns differently"):
        next_prompt_ids(rewriting, prompt, encode(rewriting, "Hello"), history, [{"role": "user", "content": "Yo"}])


def test_summary_is_a_flat_row_for_tables():
    t = Trajectory(row={}, group=2, sample=1, finish_reason="stop", reward=1.0)
    t.turns.append(Turn([1, 2], [3], [-0.5], "x", "stop", tool_calls=1))
    assert t.summary() == {
        "group": 2,
        "sample": 1,
        "finish_reason": "stop",
        "error": None,
        "num_turns": 1,
        "num_tokens": 3,
        "reward": 1.0,
        "total_reward": 1.0,
        "tool_calls": 1,
        "tool_errors": 0,
        "request_errors": 0,
        "trained_tokens": 1,
    }
