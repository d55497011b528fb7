"""Live code as source: what travels to the actors, from a cell's text or (`live.closure`) a function.

Live code travels as source, never as pickles. From a cell's text what travels is its *definitions*
-- imports, functions, classes, and assignments whose right-hand side only uses names the same text
defines and calls nothing in forge_nb -- so helpers and imports next to the function come along,
while statements that act on the kernel (``s = forge_nb.up()``, ``s.set_reward(reward)``,
``r = s.rollout()``) stay behind. A function object is captured by `live.closure` instead: exactly
the names it reads.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import functools
import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import CodeType


class LiveCodeError(ValueError):
    """Live code that cannot be used; the message names the code, the version and the cause."""


@dataclass(frozen=True)
class LiveCode:
    """`source` defines a function called `name`; `origin` says where it came from (for messages)."""

    kind: str  # "reward" or "loss"
    name: str
    source: str
    origin: str
    # A loss whose value and gradient on a sequence with advantage 0 are exactly 0 (the built-in
    # losses without KL): the trainer then leaves such sequences out of its forward and backward.
    zero_advantage_inert: bool = False
    # Folders the source's imports need on sys.path (where the user's own modules live: the actors
    # do not start in the notebook's folder), and modules to re-import first so edits to them count.
    paths: tuple[str, ...] = ()
    reload: tuple[str, ...] = ()


def from_source(kind: str, source: str, origin: str = "cell", name: str | None = None) -> LiveCode:
    """A cell's text; the function is `name` or else the last top-level function the cell defines."""
    body = definitions(source, origin)
    functions = _top_level_functions(body)
    if name is None:
        if not functions:
            raise LiveCodeError(f"{kind} ({origin}): the cell defines no function; write `def {kind}(...):`")
        name = functions[-1]
    elif name not in functions:
        raise LiveCodeError(f"{kind} ({origin}): the cell defines no function {name!r}")
    return LiveCode(kind, name, body, origin)


def definitions(source: str, origin: str, known: set[str] | None = None, forge: set[str] | None = None) -> str:
    """The top-level statements of `source` that define things and depend only on each other
    (and on `known` names), calling nothing in forge_nb. forge_nb's own decorators
    (``@forge_nb.reward``) are dropped: in an actor they would try to register the function again."""
    try:
        tree = ast.parse(source, filename=origin)
    except SyntaxError as e:
        raise LiveCodeError(f"({origin}), line {e.lineno}: SyntaxError: {e.msg}") from None
    defined, forge = set(dir(builtins)) | (known or set()), set(forge or ())
    kept = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            kept.append(ast.get_source_segment(source, node))
            names = {(a.asname or a.name).split(".")[0] for a in node.names}
            defined |= names
            if _imports_forge_nb(node):
                forge |= names
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            decorators = [d for d in node.decorator_list if _root_name(d) not in forge]
            # Decorators run at definition time: keep the def only if they are self-contained too.
            if _uses_only(decorators, defined):
                lines = [f"@{ast.get_source_segment(source, d)}" for d in decorators]
                kept.append("\n".join([*lines, ast.get_source_segment(source, node, padded=True)]))
                defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            if _uses_only([node.value], defined) and not _calls(node.value, forge):
                kept.append(ast.get_source_segment(source, node))
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return "".join(segment + "\n" for segment in kept)


def compile_function(code: LiveCode) -> Callable:
    """Execute `code.source` in a fresh namespace and return its callable `code.name`."""
    for path in code.paths:
        if path not in sys.path:
            sys.path.append(path)
    for module in code.reload:
        if module in sys.modules:
            importlib.reload(sys.modules[module])
    namespace: dict = {"__name__": f"forge_nb_live_{code.kind}"}
    exec(compile(code.source, code.origin, "exec"), namespace)
    fn = namespace.get(code.name)
    if not callable(fn):
        raise LiveCodeError(f"{code.kind} ({code.origin}): {code.name!r} is not a function after running the cell")
    return synchronous(fn) if code.kind == "reward" else fn  # an async def reward runs to completion


def synchronous(fn: Callable) -> Callable:
    """`fn` itself, or for an ``async def`` function or ``__call__`` (TRL accepts async rewards) a
    function with its signature that runs it to completion in an event loop of its own (rewards run in
    worker threads, which have none)."""
    call = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn).__call__
    if not inspect.iscoroutinefunction(call):
        return fn

    @functools.wraps(fn)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return run


def _imports_forge_nb(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] == "forge_nb"
    return any(a.name.split(".")[0] == "forge_nb" for a in node.names)


def _calls(node: ast.AST, names: set[str]) -> bool:
    """Whether `node` calls anything reached through `names` (``forge_nb.up(...)``, ``up(...)``)."""
    return any(isinstance(n, ast.Call) and _root_name(n.func) in names for n in ast.walk(node))


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute | ast.Call):
        node = node.value if isinstance(node, ast.Attribute) else node.func
    return node.id if isinstance(node, ast.Name) else None


def _top_level_functions(body: str) -> list[str]:
    return [n.name for n in ast.parse(body).body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _uses_only(nodes: list[ast.AST], defined: set[str]) -> bool:
    loads = {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loads <= defined


def origin_of(code: CodeType | None) -> str:
    """Where code was written, for messages: "cell, line 3" or "rewards.py:12"."""
    if code is None:
        return "unknown"
    filename, line = code.co_filename, code.co_firstlineno
    # ipykernel stores cells as /tmp/ipykernel_<pid>/<hash>.py; IPython as <ipython-input-N-...>.
    if "ipykernel_" in filename or filename.startswith("<"):
        return f"cell, line {line}"
    return f"{Path(filename).name}:{line}"
