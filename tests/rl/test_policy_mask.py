"""Multi-turn completions train on the policy's tokens only: tool results and environment messages are
attended to, never trained on (`PrefixBatch.policy_mask`)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from forge_nb.config import AlgorithmConfig
from forge_nb.live.builtin import builtin_loss
from forge_nb.live.capture import compile_function
from forge_nb.rl.prefix_batch import collate_prefix
from forge_nb.rl.update import UpdateOptions, policy_update

PROMPT = [5, 6, 7, 8]
REPLY_1, TOOL_RESULT, REPLY_2 = [9, 10, 11], [20, 21, 22, 23], [12, 13]


def _model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    return LlamaForCausalLM(config)


def _gradient(completions: list[list[int]], masks: list[list[int]], old: list[list[float]]) -> dict:
    model = _model()
    loss = compile_function(builtin_loss(AlgorithmConfig(loss="grpo", token_level=True), max_tokens=16))
    batch = collate_prefix([PROMPT] * len(completions), completions, 0, old, [1.0, -1.0], None, masks)
    metrics, _ = policy_update(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, loss, UpdateOptions(1.0, 1e9))
    return {n: p.grad.clone() for n, p in model.named_parameters()}, metrics


def _trajectory(tool_result: list[int], tail: list[int]) -> tuple[list[int], list[int]]:
    """reply 1 (policy) + tool result (masked) + reply 2 (policy) + a last environment message (masked)."""
    tokens = REPLY_1 + tool_result + REPLY_2 + tail
    mask = [1] * len(REPLY_1) + [0] * len(tool_result) + [1] * len(REPLY_2) + [0] * len(tail)
    return tokens, mask


def test_the_loss_counts_the_policy_tokens_and_ignores_what_the_masked_ones_carry():
    a, mask = _trajectory(TOOL_RESULT, [30, 31])
    old = [[-1.0] * len(a), [-2.0] * len(a)]
    noisy = [[lp if m else 99.0 for lp, m in zip(row, mask)] for row in old]  # junk where masked
    (grads, metrics), (same, _) = _gradient([a, a], [mask, mask], old), _gradient([a, a], [mask, mask], noisy)
    assert metrics["tokens"] == 2 * sum(mask)
    assert all(torch.equal(grads[n], same[n]) for n in grads)


@pytest.mark.parametrize("tail", [[30, 31], [40, 41, 42, 43, 44]])
def test_changing_a_final_environment_message_leaves_the_gradient_unchanged(tail):
    """The last message after the policy's last reply: different tokens, same gradient (nothing trained
    comes after it, and it is never a target). A tool result between replies is context for the second
    reply, so changing it does change that reply's gradient, as it should."""
    base, mask = _trajectory(TOOL_RESULT, [30, 31])
    other, other_mask = _trajectory(TOOL_RESULT, tail)
    old = [[-1.0] * len(base), [-1.5] * len(base)]
    other_old = [[-1.0] * len(other), [-1.5] * len(other)]
    grads, _ = _gradient([base, base], [mask, mask], old)
    changed, _ = _gradient([other, other], [other_mask, other_mask], other_old)
    assert all(torch.allclose(grads[n], changed[n], atol=1e-6) for n in grads)
