"""Several optimizer steps per batch (`rl.epochs`): mini-batches of whole groups, the order of the steps, a
loss that fails midway, and the batch's metrics."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from forge_nb.models import BUNDLED_MODEL
from forge_nb.rl import epochs
from forge_nb.rl.batch import TrainBatch
from forge_nb.rl.update import policy_update


def batch(groups: list[int], keep: bool = True) -> TrainBatch:
    """Groups of the given sizes, prompt i = [i + 1] twice; completion j of group i = [i, j]."""
    prompts, completions = [], []
    for i, size in enumerate(groups):
        prompts += [[i + 1, i + 1]] * size
        completions += [[i, j] for j in range(size)]
    n = len(prompts)
    return TrainBatch(
        prompts,
        completions,
        [[-1.0 - r, -2.0] for r in range(n)],
        [float(r % 3 - 1) for r in range(n)],
        keep_logprobs=keep,
        loss_rows=[1] * n,
    )


def test_a_batch_splits_into_runs_of_whole_groups_as_even_as_they_divide():
    b = batch([2, 3, 2, 2, 1])
    assert [list(g) for g in epochs.groups(b)] == [[0, 1], [2, 3, 4], [5, 6], [7, 8], [9]]
    parts = epochs.split(b, 2)
    assert [len(p) for p in parts] == [7, 3]  # groups 3 + 2
    assert parts[1].prompt_ids == b.prompt_ids[7:] and parts[1].advantages == b.advantages[7:]
    assert parts[1].logprobs == b.logprobs[7:] and parts[1].loss_rows == [1, 1, 1]
    assert [len(p) for p in epochs.split(b, 5)] == [2, 3, 2, 2, 1]
    assert [len(p) for p in epochs.split(b, 9)] == [2, 3, 2, 2, 1]  # no more parts than groups
    assert epochs.split(b, 1) == [b]


def test_steps_run_mini_batch_by_mini_batch_each_epoch_and_the_first_pass_gives_the_logprobs():
    b, seen = batch([2, 2, 2]), []

    def update(part):
        seen.append(part.completion_ids[0])
        return {"loss": float(len(seen)), "tokens": len(part) * 2}, [[len(seen)] * 2 for _ in range(len(part))]

    steps = epochs.run(b, 2, 3, update, (ValueError,))
    assert seen == [[0, 0], [1, 0], [2, 0]] * 2 and steps.error is None and steps.rows == [2, 2, 2]
    assert steps.logprobs == [[1, 1]] * 2 + [[2, 2]] * 2 + [[3, 3]] * 2  # from the first pass only
    assert steps.combined() == {"loss": 3.5, "tokens": 12, "updates": 6}


def test_a_loss_failing_on_a_later_step_keeps_the_steps_before_and_says_so():
    b, calls = batch([2, 2]), []

    def update(part):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("second")
        return {"loss": 1.0}, [[9.0, 9.0]] * len(part)

    steps = epochs.run(b, 2, 2, update, (ValueError,))
    assert len(steps.metrics) == 1 and str(steps.error) == "second"
    assert steps.logprobs == [[9.0, 9.0]] * 2 + b.logprobs[2:]  # rows not reached keep the behaviour logprobs
    with pytest.raises(ValueError, match="second"):  # on the first step: nothing was stepped
        calls.clear()
        calls.append(0)
        epochs.run(b, 1, 2, update, (ValueError,))
    with pytest.raises(KeyError):  # not the loss's: it propagates
        epochs.run(b, 2, 2, lambda part: {}[0], (ValueError,))


def test_one_step_keeps_its_metrics_and_several_combine_as_the_batch():
    one = {"loss": 0.5, "tokens": 7, "entropy": float("nan")}
    assert epochs.combine([one], [4]) == {**one, "updates": 1}
    steps = [
        {"loss": 1.0, "tokens": 10, "rows_skipped": 1, "entropy": 2.0, "response_length": 4.0, "micro_batches": 1,
         "max_abs_logprob_diff": 0.1, "response_length_max": 6},
        {"loss": 3.0, "tokens": 5, "rows_skipped": 0, "entropy": float("nan"), "response_length": 1.0,
         "micro_batches": 2, "max_abs_logprob_diff": 0.3, "response_length_max": 2},
        {"loss": 2.0, "tokens": 10, "rows_skipped": 1, "entropy": 1.0, "response_length": 4.0, "micro_batches": 1,
         "max_abs_logprob_diff": 0.2, "response_length_max": 6},
    ]  # fmt: skip
    out = epochs.combine(steps, [3, 1])  # two mini-batches (3 rows, 1 row); the third step is epoch 2's
    assert out["loss"] == 2.0 and out["updates"] == 3
    assert out["tokens"] == 15 and out["rows_skipped"] == 1  # the first pass: each row once
    assert out["response_length"] == (4.0 * 3 + 1.0 * 1) / 4
    assert out["entropy"] == 1.5  # the steps that measured it
    assert out["micro_batches"] == 2 and out["max_abs_logprob_diff"] == 0.3 and out["response_length_max"] == 6
    assert math.isnan(epochs.combine([{"entropy": float("nan")}] * 2, [1, 1])["entropy"])
    skipped, ran = {"loss": 0.0, "entropy": float("nan")}, {"loss": 1.0, "entropy": 2.0, "kl_ref": 0.5}
    assert epochs.combine([skipped, ran], [1, 1]) == {"loss": 0.5, "entropy": 2.0, "kl_ref": 0.5, "updates": 2}


def test_two_epochs_of_two_mini_batches_are_four_policy_updates_in_that_order():
    """The schedule through the real step: the same weights as four `policy_update` calls made by hand."""
    b = batch([2, 2, 2, 2], keep=False)
    models = []
    for _ in range(2):
        model = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL)
        models.append((model, torch.optim.AdamW(model.parameters(), lr=1e-2)))

    def update(model, optimizer):
        return lambda part: (policy_update(model, optimizer, part.collate(0), _loss)[0], None)

    steps = epochs.run(b, 2, 2, update(*models[0]), ())
    by_hand = update(*models[1])
    for part in [*epochs.split(b, 2)] * 2:
        by_hand(part)
    assert steps.combined()["updates"] == 4
    for p, q in zip(models[0][0].parameters(), models[1][0].parameters()):
        assert torch.equal(p, q)
    fresh = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL)
    assert not torch.equal(next(models[0][0].parameters()), next(fresh.parameters()))  # it did train


def _loss(logprobs, old_logprobs, advantages, mask):
    ratio = (logprobs - old_logprobs).exp()
    return -(ratio * advantages[:, None] * mask).sum() / mask.sum()
