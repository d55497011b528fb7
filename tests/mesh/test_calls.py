from forge_nb.mesh.calls import shards


def test_shards_are_contiguous_nearly_equal_and_never_empty():
    assert shards(10, 3) == [slice(0, 4), slice(4, 8), slice(8, 12)]
    assert shards(2, 4) == [slice(0, 1), slice(1, 2)]
    assert shards(5, 1) == [slice(0, 5)]
    items = list(range(10))
    assert [x for part in shards(10, 3) for x in items[part]] == items
