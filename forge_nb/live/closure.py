"""Capture a function (or a callable object) as source: exactly what it needs, and nothing that acts.

A function from an importable module travels by reference: an import line, with the module's folder
on the actors' sys.path and the module re-imported there, so a team's shared ``rewards.py`` works
as it is on disk. A function written in a notebook cell or a script travels as its own definition
plus the transitive closure of the global names it, and every helper it calls, reads: imports become
import lines, helper functions and classes defined beside it travel as their source, constants
(numbers, strings, containers of them, compiled regexes) as literals. Statements of the file or cell
never travel, so ``s = forge_nb.up()`` next to a reward starts nothing anywhere. A name whose value
cannot travel as source (the session, a tokenizer, an open file) is a clear error naming it. A
callable object (a reward class with ``__init__`` and ``__call__``, as TRL accepts) travels as its
class plus its attribute values.
"""

from __future__ import annotations

import ast
import builtins
import dis
import inspect
import linecache
import re
import site
import sys
import sysconfig
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forge_nb.live.capture import LiveCode, LiveCodeError, origin_of

_LITERALS = (type(None), bool, int, float, complex, str, bytes)
_CONTAINERS = (tuple, list, set, frozenset, dict)
_MISSING = object()


def capture_callable(kind: str, fn: Callable) -> LiveCode:
    """`fn` (a function, or an object with ``__call__``) -> `LiveCode` that defines it under its name."""
    if isinstance(fn, types.FunctionType):
        if fn.__name__ == "<lambda>":
            closure = _Closure(kind, kind)
            closure.add_function(fn, as_name=kind)
            return closure.code(kind, origin_of(fn.__code__))
        closure = _Closure(kind, fn.__name__)
        if _importable(fn):
            closure.need(fn.__name__, fn, owner=fn.__name__)  # by reference
        else:
            closure.add_function(fn)
        return closure.code(fn.__name__, origin_of(fn.__code__))
    if isinstance(fn, type):  # an environment class (called once per trajectory), defined or imported
        closure = _Closure(kind, fn.__name__)
        return closure.code(closure.need(fn.__name__, fn, owner=fn.__name__), f"class {fn.__qualname__}")
    if callable(fn) and not isinstance(fn, type | types.BuiltinFunctionType | types.MethodType):
        cls = type(fn)
        name = _instance_name(cls)
        closure = _Closure(kind, name)
        cls_name = closure.need(cls.__name__, cls, owner=f"the class of {name}")
        state = closure.expression(_state_of(fn), f"the attributes of the {cls.__name__} object", name)
        closure.tail += [f"{name} = {cls_name}.__new__({cls_name})", f"{name}.__dict__.update({state})"]
        return closure.code(name, f"{cls.__name__} object ({origin_of(_call_code(cls))})")
    raise LiveCodeError(
        f"set_{kind} takes a function, an object with __call__, a cell's source or version=N; got {type(fn).__name__}"
    )


class _Closure:
    """Collects import lines, constants, definitions and aliases, each once, in an order that runs."""

    def __init__(self, kind: str, target: str) -> None:
        self.kind, self.target = kind, target
        self.imports: dict[str, str] = {}  # bound name -> import line
        self.constants: dict[str, str] = {}  # name -> assignment
        self.definitions: dict[str, str] = {}  # name -> def / class source, dependencies first
        self.aliases: dict[str, str] = {}  # name -> assignment to a definition under another name
        self.objects: dict[str, str] = {}  # name -> assignment of an object built from definitions
        self.tail: list[str] = []
        self.bound: dict[str, Any] = {}  # names bound for values inside objects -> those values
        self.paths: dict[str, None] = {}
        self.reload: dict[str, None] = {}
        self._seen: set[int] = set()

    def code(self, name: str, origin: str) -> LiveCode:
        parts = [*self.imports.values(), *self.constants.values(), *self.definitions.values()]
        later = [*self.aliases.values(), *self.objects.values(), *self.tail]
        source = "\n".join(p.rstrip() + "\n" for p in [*parts, *later])
        return LiveCode(self.kind, name, source, origin, paths=tuple(self.paths), reload=tuple(self.reload))

    def add_function(self, fn: types.FunctionType, as_name: str | None = None) -> None:
        if id(fn) in self._seen:
            return
        self._seen.add(id(fn))
        if fn.__name__ == "<lambda>":
            text = f"{as_name or self.kind} = {_lambda_text(fn.__code__, self.kind)}\n"
        else:
            text, node = _definition(fn.__code__, fn.__name__, self.kind)
            text = _drop_lines(text, [d for d in node.decorator_list if _is_forge_nb(d, fn.__globals__)])
        # A function defined inside another reads the outer one's variables: their values travel too.
        cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))
        defined = as_name or fn.__name__
        for name in sorted(_free_names(text) - {defined}):
            value = cells[name] if name in cells else fn.__globals__.get(name, _MISSING)
            self.need(name, value, owner=defined)
        self.definitions[defined] = text

    def add_class(self, cls: type) -> None:
        if id(cls) in self._seen:
            return
        self._seen.add(id(cls))
        text = _class_definition(cls, self.kind)
        namespace = _class_globals(cls)
        for name in sorted(_free_names(text) - {cls.__name__}):
            self.need(name, namespace.get(name, _MISSING), owner=cls.__name__)
        self.definitions[cls.__name__] = text

    def need(self, name: str, value: Any, owner: str) -> str:
        """Make global `name` (bound to `value` where `owner` reads it) available -> the name."""
        if value is _MISSING:
            if hasattr(builtins, name) or name in (self.target, "__class__"):
                return name
            raise LiveCodeError(f"{self.kind} {owner!r} reads the global {name!r}, which is not defined")
        if isinstance(value, types.ModuleType):
            self._import(name, value.__name__)
        elif _importable(value):
            self._import(name, value.__module__, value.__qualname__)
        elif isinstance(value, types.FunctionType):
            self.add_function(value)
            if value.__name__ != name:
                self.aliases[name] = f"{name} = {value.__name__}"
        elif isinstance(value, type):
            self.add_class(value)
        elif isinstance(value, re.Pattern):
            self.constants[name] = f"{name} = __import__('re').compile({value.pattern!r}, {int(value.flags)})"
        elif getattr(builtins, name, _MISSING) is value:
            return name
        elif type(value).__module__.split(".")[0] == "forge_nb" and not _travels_as_object(value):
            raise LiveCodeError(
                f"{self.kind} {owner!r} reads {name!r}, a forge_nb {type(value).__name__}: live code runs in the "
                "actors and cannot reach the session; pass what it needs as constants"
            )
        elif _only_literals(value):
            self.constants[name] = f"{name} = {_literal(value, f'the global {name!r} that {owner!r} reads')}"
        else:
            what = f"the global {name!r} that {owner!r} reads"
            self.objects[name] = f"{name} = {self.expression(value, what, owner)}"
        return name

    def expression(self, value: Any, what: str, owner: str) -> str:
        """Source of an expression that rebuilds `value` where the code runs: a literal, or containers,
        functions, classes, regexes and objects that travel (`_travels_as_object`), whatever they need
        made available; otherwise `LiveCodeError` naming `what`."""
        if _only_literals(value):
            return _literal(value, what)
        kind = type(value)
        if kind in (list, tuple, set, frozenset):
            items = [self.expression(v, what, owner) for v in value]
            if kind is tuple:
                return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
            text = ", ".join(items)
            return {list: f"[{text}]", set: f"{{{text}}}", frozenset: f"frozenset([{text}])"}[kind]
        if kind is dict and all(_only_literals(k) for k in value):
            return "{" + ", ".join(f"{k!r}: {self.expression(v, what, owner)}" for k, v in value.items()) + "}"
        if isinstance(value, re.Pattern):
            return f"__import__('re').compile({value.pattern!r}, {int(value.flags)})"
        if isinstance(value, types.FunctionType | type) and value.__name__ != "<lambda>":
            return self._bind(value.__name__, value, what, owner)
        if _travels_as_object(value):
            cls_name = self._bind(kind.__name__, kind, what, owner)
            state = self.expression(_state_of(value), f"the attributes of the {kind.__name__} in {what}", owner)
            self.definitions.setdefault("_forge_nb_object", _OBJECT_HELPER)
            return f"_forge_nb_object({cls_name}, {state})"
        return _literal(value, what)  # raises, naming what cannot travel

    def _bind(self, name: str, value: Any, what: str, owner: str) -> str:
        """`need` a function or class found inside a value, under its own name (which must be free)."""
        if self.bound.get(name, value) is not value:
            raise LiveCodeError(f"{self.kind}: {what} holds two different things named {name!r}; rename one")
        self.bound[name] = value
        return self.need(name, value, owner)

    def _import(self, name: str, module: str, attribute: str | None = None) -> None:
        if module == "__main__":
            raise LiveCodeError(f"{self.kind}: {name!r} is the notebook or script itself, which cannot travel")
        if attribute is None:
            line = f"import {module}" if module == name else f"import {module} as {name}"
        else:
            line = f"from {module} import {attribute}" + ("" if attribute == name else f" as {name}")
        self.imports[name] = line
        root = _user_module_root(module)
        if root is not None:  # the user's own module: the actors need its folder, and its current text
            self.paths[root] = None
            self.reload[module] = None


def _definition(code: types.CodeType, name: str, kind: str) -> tuple[str, ast.FunctionDef]:
    """The dedented text and parsed node of the `def` a code object came from (file or cell)."""
    lines = linecache.getlines(code.co_filename)
    if not lines:
        raise LiveCodeError(
            f"{kind} {name!r}: cannot find its source ({code.co_filename}); define it in a cell or file"
        )
    text = textwrap.dedent("".join(inspect.getblock(lines[code.co_firstlineno - 1 :])))
    node = ast.parse(text).body[0]
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        raise LiveCodeError(f"{kind} {name!r}: its source is not a def statement ({origin_of(code)})")
    return text, node


def _lambda_text(code: types.CodeType, kind: str) -> str:
    """The source of the one lambda written on its line with these parameters."""
    lines = linecache.getlines(code.co_filename)[code.co_firstlineno - 1 :]
    params = list(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
    for end in range(1, min(len(lines), 50) + 1):  # the smallest run of lines from there that parses
        text = textwrap.dedent("".join(lines[:end]))
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        found = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Lambda)
            and n.lineno == 1
            and [a.arg for a in n.args.args + n.args.kwonlyargs] == params
        ]
        if len(found) == 1:
            return ast.get_source_segment(text, found[0])
        break
    raise LiveCodeError(f"{kind}: cannot tell this lambda's source from its line ({origin_of(code)}); use a def")


def _class_definition(cls: type, kind: str) -> str:
    """The text of the `class` statement of `cls`. Found through its methods' code (file and line:
    exact even when a cell redefined the class); for a class without methods, the last class of that
    name in its module's file or in the notebook's cells (IPython keeps cells in linecache)."""
    codes = [c for c in map(_code_of, vars(cls).values()) if c is not None]
    module = sys.modules.get(cls.__module__)
    files = list(dict.fromkeys(c.co_filename for c in codes))
    if not files:
        files = [module.__file__] if getattr(module, "__file__", None) else []
        files += [f for f in list(linecache.cache) if "ipykernel_" in f or f.startswith("<ipython-input")]
    found = None
    for filename in files:
        text = "".join(linecache.getlines(filename))
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls.__name__ and _holds(node, codes, filename):
                found = (text, node)
    if found is None:
        raise LiveCodeError(f"{kind}: cannot find the source of class {cls.__name__!r}; define it in a cell or file")
    text, node = found
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return textwrap.dedent("".join(text.splitlines(keepends=True)[first - 1 : node.end_lineno]))


def _code_of(member: Any) -> types.CodeType | None:
    function = member.__func__ if isinstance(member, staticmethod | classmethod) else member
    return function.__code__ if isinstance(function, types.FunctionType) else None


def _holds(node: ast.ClassDef, codes: list[types.CodeType], filename: str) -> bool:
    """Whether the class statement `node` contains the methods whose code is `codes`."""
    return all(node.lineno <= c.co_firstlineno <= node.end_lineno for c in codes if c.co_filename == filename)


def _drop_lines(text: str, nodes: list[ast.AST]) -> str:
    """`text` without the lines of `nodes` (forge_nb's decorators), comments and layout kept."""
    drop = {n for node in nodes for n in range(node.lineno, node.end_lineno + 1)}
    return "".join(line for i, line in enumerate(text.splitlines(keepends=True), 1) if i not in drop)


def _call_code(cls: type) -> types.CodeType | None:
    return _code_of(vars(cls).get("__call__"))  # the class's own __call__ (where it was written)


def _free_names(text: str) -> set[str]:
    """The global names a definition's text reads when it runs: its decorators, defaults and class
    body at definition time, its body (and nested functions, comprehensions) when called. Dunder
    names (a class body reads ``__name__``) belong to wherever the source runs."""
    return {n for n in _reads(compile(text, "<live>", "exec")) if not (n.startswith("__") and n.endswith("__"))}


def _reads(code: types.CodeType) -> set[str]:
    """Names `code` looks up globally, minus those a module or class body binds itself first."""
    ops = list(dis.get_instructions(code))
    loads = {i.argval for i in ops if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    stores = {i.argval for i in ops if i.opname in ("STORE_NAME", "STORE_GLOBAL")}
    nested = set().union(*(_reads(c) for c in code.co_consts if isinstance(c, types.CodeType)))
    return (loads - stores) | nested


def _is_forge_nb(decorator: ast.AST, namespace: dict) -> bool:
    """A decorator from forge_nb (``@forge_nb.reward``): in an actor it would register the function again."""
    root = decorator
    while isinstance(root, ast.Attribute | ast.Call):
        root = root.value if isinstance(root, ast.Attribute) else root.func
    value = namespace.get(root.id) if isinstance(root, ast.Name) else None
    module = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", "") or ""
    return module.split(".")[0] == "forge_nb"


def _importable(value: Any) -> bool:
    """An object another process gets by importing it: defined at the top of a real module."""
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if not module or not qualname or module == "__main__" or module.startswith("forge_nb_live"):
        return False
    loaded = sys.modules.get(module)
    if loaded is None or (getattr(loaded, "__file__", None) is None and module not in sys.builtin_module_names):
        return False
    return getattr(loaded, qualname, None) is value


def _user_module_root(module: str) -> str | None:
    """The sys.path folder of the user's own module (one under the working directory that is neither
    installed nor forge_nb: a ``rewards.py`` beside the notebook) -> that folder; None otherwise."""
    file = getattr(sys.modules.get(module), "__file__", None)
    if file is None or module.split(".")[0] == "forge_nb":
        return None
    path = Path(file).resolve()
    installed = [*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["stdlib"]]
    if not path.is_relative_to(Path.cwd().resolve()) or any(
        path.is_relative_to(Path(p).resolve()) for p in installed if p
    ):
        return None
    if path.name == "__init__.py":
        path = path.parent
    return str(path.parents[len(module.split(".")) - 1])


def _literal(value: Any, what: str) -> str:
    """`value` as a Python literal that evaluates back to it, or `LiveCodeError` naming `what`."""
    text = repr(value)
    try:
        if _only_literals(value) and ast.literal_eval(text) == value:
            return text
    except (ValueError, SyntaxError, RecursionError):
        pass
    raise LiveCodeError(
        f"{what} is a {type(value).__name__} ({text[:50]}), which cannot travel as source: make it a constant "
        "(numbers, strings, lists, dicts), build it inside the function, or import the reward from a module"
    )


def _only_literals(value: Any, depth: int = 0) -> bool:
    if depth > 50:
        return False
    if type(value) in _LITERALS:
        return True
    if type(value) in _CONTAINERS:
        items = value.items() if isinstance(value, dict) else ((v, None) for v in value)
        return all(_only_literals(k, depth + 1) and _only_literals(v, depth + 1) for k, v in items)
    return False


_OBJECT_HELPER = """def _forge_nb_object(cls, state):
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj
"""


def _state_of(obj: Any) -> dict:
    """What an object travels with: its ``__getstate__`` if its class defines one, else its attributes."""
    if type(obj).__getstate__ is not object.__getstate__:
        return obj.__getstate__()
    return dict(vars(obj))


def _travels_as_object(value: Any) -> bool:
    """An object rebuilt from its class and state where the code runs: one of forge_nb's reward
    objects (a `Judge`, an `Ensemble`), or a callable object of the user's own class. A library's
    object (a tensor, a tokenizer) or a plain object of a notebook class does not travel."""
    cls = type(value)
    if not hasattr(value, "__dict__") or isinstance(value, type | types.ModuleType | types.FunctionType):
        return False
    if cls.__module__.startswith("forge_nb.rewards"):
        return True
    own = not _importable(cls) or _user_module_root(cls.__module__) is not None
    return callable(value) and own and cls.__module__.split(".")[0] != "forge_nb"


def _instance_name(cls: type) -> str:
    """The name a callable object is bound to in its source: its class name in snake case."""
    return "_".join(re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", cls.__name__)).lower() or "live_object"


def _class_globals(cls: type) -> dict[str, Any]:
    """The globals `cls`'s methods read: their own `__globals__` (right for a script run with runpy, where
    `sys.modules["__main__"]` is someone else), else its module's."""
    for attr in vars(cls).values():
        fn = getattr(attr, "__func__", attr)
        if isinstance(fn, types.FunctionType):
            return fn.__globals__
    module = sys.modules.get(cls.__module__)
    return vars(module) if module is not None else {}
