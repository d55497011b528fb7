"""Step messages cross procs C-pickled whole, and fall back to Monarch's pickler where only it can carry them."""

import pickle
from dataclasses import dataclass

from monarch._src.actor.pickle import flatten, unflatten

from forge_nb.actors.generator import Generation
from forge_nb.engines.base import Completion
from forge_nb.rewards.batch import Scores
from forge_nb.wire import Packed, pack


@dataclass(frozen=True)
class _Message(Packed):
    values: list
    note: object = None


def _through_monarch(obj):
    saved, buffer = flatten(obj, lambda o: False)
    return unflatten(buffer.freeze(), saved)


def test_a_message_crosses_as_one_bytes_object_and_comes_back_equal():
    group = [Completion([1, 2], [3, 4], [-0.5, -0.25], "34", "stop") for _ in range(3)]
    generation = Generation([group, group], 7, 0.25)
    back = _through_monarch(generation)
    assert back == generation and type(back) is Generation and back.completions[1][2].token_ids == [3, 4]
    reduced = generation.__reduce__()
    assert isinstance(reduced[1][1], bytes)  # the C pickler's bytes: Monarch's pickler sees one object
    scores = Scores([1.0, None], {1: "reward: raised ValueError"}, 3, {"reward": [1.0, None]})
    assert pickle.loads(pickle.dumps(scores)) == scores


def test_what_only_cloudpickle_can_carry_falls_back_to_monarchs_pickler():
    class Local:  # defined in a function: the C pickler cannot name it
        pass

    def twice(x):
        return 2 * x

    assert isinstance(pack({"fn": lambda x: x}), dict)
    assert isinstance(pack({"obj": Local()}), dict)
    back = _through_monarch(_Message([1, 2], twice))
    assert back.values == [1, 2] and back.note(4) == 8


def test_a_class_of_a_notebook_is_not_named_by_reference():
    main_class = type("FromANotebook", (), {"__module__": "__main__"})
    import __main__

    __main__.FromANotebook = main_class
    try:
        assert isinstance(pack({"row": main_class()}), dict)  # a proc has no such `__main__` attribute
    finally:
        del __main__.FromANotebook
