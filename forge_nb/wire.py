"""How the generator's answer crosses to the kernel: pickled whole, as one bytes object.

Monarch pickles an endpoint's arguments and its answer with cloudpickle, whose `reducer_override` is a Python
call for every object that is not a builtin (numbers, strings, lists and dicts go at C speed): every
`Completion` of a generation, 256 a step on the bundled model. Measured with Monarch's own `pickle` (the one its
endpoints use) on a captured step: the answer took 0.49 ms; `Packed`, which pickles its fields with the C
pickler inside `__reduce__` so that cloudpickle sees one bytes object, 0.17 ms. Messages of plain lists
(`TrainBatch`, `RewardBatch`, `Scores`, `TrainResult`) gain nothing from it (0.034 -> 0.043 ms: one more copy)
and are not packed.

The C pickler writes a class by reference. A field holding something only cloudpickle can carry (a
lambda, a class or function defined in a notebook, i.e. in ``__main__``, which a proc cannot import)
falls back to Monarch's pickler for the fields, as before: never an error the plain path would not raise.
"""

from __future__ import annotations

import pickle
from typing import Any

_MAIN = b"__main__"  # the C pickler names a notebook's class or function by this module: a proc has none


class Packed:
    """Mixin for a message dataclass holding many small dataclasses of plain data (numbers, strings, lists):
    its fields cross to another proc as one C-pickled bytes object. `copy.copy` gives a deep copy, as a
    message that went through a proc would be."""

    def __reduce__(self) -> tuple[Any, tuple[type, bytes | dict]]:
        return _unpacked, (type(self), pack(self.__dict__))


def pack(state: dict[str, Any]) -> bytes | dict[str, Any]:
    """`state` C-pickled -> bytes; `state` itself when only cloudpickle can carry it."""
    try:
        data = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return state
    return state if _MAIN in data else data


def _unpacked(cls: type, data: bytes | dict[str, Any]) -> Any:
    obj = cls.__new__(cls)
    obj.__dict__.update(pickle.loads(data) if isinstance(data, bytes) else data)
    return obj
