import torch

from forge_nb.rl.batch import collate


def test_collate_aligns_completion_mask_and_old_logprobs_with_next_token_targets():
    batch = collate([[1, 5, 6], [1, 7]], [[8, 2], [9, 10, 2]], pad_id=0, old_logprobs=[[-0.1, -0.2], [-1, -2, -3]])
    assert batch.input_ids.tolist() == [[1, 5, 6, 8, 2], [1, 7, 9, 10, 2]]
    assert batch.completion_mask.tolist() == [[0, 0, 1, 1], [0, 1, 1, 1]]
    assert torch.allclose(batch.old_logprobs, torch.tensor([[0, 0, -0.1, -0.2], [0, -1, -2, -3.0]]))
    # target of position t is input_ids[t + 1]: the masked targets are exactly the completions
    targets = batch.input_ids[:, 1:][batch.completion_mask.bool()].tolist()
    assert targets == [8, 2, 9, 10, 2]


def test_collate_right_pads():
    batch = collate([[1, 5]], [[2]], pad_id=0)
    assert batch.attention_mask.tolist() == [[1, 1, 1]]
    batch = collate([[1, 5], [1]], [[2], [2]], pad_id=0)
    assert batch.input_ids.tolist() == [[1, 5, 2], [1, 2, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]


def test_collate_cuts_logprobs_to_the_completion_and_places_reference_logprobs():
    batch = collate(
        [[1, 5], [1]], [[], [7, 2]], pad_id=0, old_logprobs=[[-9.0], [-1, -2, -3]], ref_logprobs=[[], [-4, -5]]
    )
    assert batch.completion_mask.tolist() == [[0, 0], [1, 1]]  # an empty completion has no target
    assert batch.old_logprobs.tolist() == [[0, 0], [-1, -2]]  # the logprob past the completion is dropped
    assert batch.ref_logprobs.tolist() == [[0, 0], [-4, -5]]
    assert collate([[1]], [[2]], pad_id=0).ref_logprobs is None


def _episode(ids: list[int], finish_reason: str, mask: list[int] | None = None):
    from forge_nb.rl.episode import Episode

    return Episode(0, 0, "p", "p", "c", "t", [1, 5], ids, [-0.5] * len(ids), finish_reason, 0, completion_mask=mask)


def test_mask_truncated_leaves_completions_cut_at_max_tokens_out_of_the_loss():
    from forge_nb.rl.batch import TrainBatch

    episodes = [_episode([3, 4, 2], "stop"), _episode([3, 4, 4, 4], "length"), _episode([3, 7, 9], "stop", [1, 0, 1])]
    assert TrainBatch.of(episodes[:2]).loss_rows is None  # off: nothing left out, nothing sent
    assert TrainBatch.of(episodes[:1], mask_truncated=True).loss_rows is None  # none cut
    batch = TrainBatch.of(episodes, mask_truncated=True)
    assert batch.loss_rows == [1, 0, 1] and batch.policy_masks == [[1, 1, 1], [1, 1, 1, 1], [1, 0, 1]]
    for full in (False, True):
        tokens = batch.collate(pad_id=0, full_sequences=full)
        assert tokens.loss_mask.sum(1).tolist() == [3.0, 0.0, 2.0]
        assert tokens.policy_tokens.sum(1).tolist() == [3.0, 4.0, 2.0]  # its length still counts
        assert tokens.select(torch.tensor([1, 2])).loss_mask.sum(1).tolist() == [0.0, 2.0]
