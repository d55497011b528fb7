"""The generator's answer crosses procs C-pickled whole; what only cloudpickle can carry goes as before."""

from dataclasses import dataclass

from monarch._rust_bindings.monarch_hyperactor.pickle import pickle as monarch_pickle

from forge_nb.actors.generator import Generation
from forge_nb.engines.base import Completion
from forge_nb.wire import Packed, pack


@dataclass(frozen=True)
class _Message(Packed):
    values: list
    note: object = None


def _through_monarch(obj):
    """As an endpoint's answer travels: Monarch's pickle (cloudpickle inside), then unpickled."""
    return monarch_pickle(obj, allow_tensor_engine_references=False, allow_mesh_references=True).unpickle()


def test_a_generation_crosses_as_one_bytes_object_and_comes_back_equal():
    group = [Completion([1, 2], [3, 4], [-0.5, -0.25], "34", "stop") for _ in range(3)]
    generation = Generation([group, group], 7, 0.25)
    back = _through_monarch(generation)
    assert back == generation and type(back) is Generation and back.completions[1][2].token_ids == [3, 4]
    assert isinstance(generation.__reduce__()[1][1], bytes)  # cloudpickle sees one object, not 6 completions


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
