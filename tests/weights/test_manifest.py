import torch

from forge_nb.weights.manifest import checksum, layout, views


def test_layout_and_views_round_trip_every_tensor_bitwise():
    named = [("a", torch.randn(3, 5)), ("b", torch.arange(7, dtype=torch.int64)), ("c", torch.randn(2).bfloat16())]
    slots, total = layout(named)
    assert all(s.offset % 64 == 0 for s in slots)
    flat = torch.zeros(total, dtype=torch.uint8)
    for (_, src), (_, dst) in zip(named, views(flat, slots)):
        dst.copy_(src)
    assert all(torch.equal(src, dst) for (_, src), (_, dst) in zip(named, views(flat, slots)))
    assert checksum(named) == checksum(views(flat, slots))


def test_checksum_sees_a_single_changed_element():
    a = [("w", torch.zeros(4))]
    b = [("w", torch.tensor([0.0, 0.0, 1e-30, 0.0]))]
    assert checksum(a) != checksum(b)
    assert checksum(a) == checksum([("w", torch.zeros(4))])
