"""How the step's messages cross process boundaries: each one pickled whole, as one bytes object.

Monarch pickles an endpoint's arguments and its answer with a cloudpickle subclass that calls a Python
hook (`persistent_id`) on every object it writes, every int and float in a list included. A generator's
answer on the bundled model (256 completions, their token ids and logprobs, ~20 kB) took 0.82 ms that
way and 0.16 ms with the C pickler; a step sends five such messages, on its critical path. `Packed`
messages therefore pickle their fields with the C pickler inside `__reduce__`, so Monarch's pickler
sees one bytes object.

The C pickler writes a class by reference. A field holding something only cloudpickle can carry (a
lambda, a class or function defined in a notebook, i.e. in ``__main__``, which a proc cannot import)
falls back to Monarch's pickler for the fields, as before: never an error the plain path would not raise.
"""

from __future__ import annotations

import pickle
from typing import Any

_MAIN = b"__main__"  # the C pickler names a notebook's class or function by this module: a proc has none


class Packed:
    """Mixin for a message dataclass of plain data (numbers, strings, lists, dicts, dataclasses of those):
    its fields cross to another proc as one C-pickled bytes object. No behaviour changes: `copy.copy`
    gives a deep copy, as a message that went through a proc would be."""

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
