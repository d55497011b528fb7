"""Capture live code as source: a cell, or the cell / module a function was defined in.

Live code travels as source, never as pickles. What travels is the *definitions* of the cell or
module -- imports, functions, classes, and assignments whose right-hand side only uses names the
same source defines -- so helpers and imports next to the function come along, while statements
that act on the kernel (``s.set_reward(reward)``, ``r = s.rollout()``) stay behind.
"""

from __future__ import annotations

import ast
import builtins
import linecache
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


class LiveCodeError(ValueError):
    """Live code that cannot be used; the message names the code, the version and the cause."""


@dataclass(frozen=True)
class LiveCode:
    """`source` defines a function called `name`; `origin` says where it came from (for messages)."""

    kind: str  # "reward" or "loss"
    name: str
    source: str
    origin: str


def from_function(kind: str, fn: Callable) -> LiveCode:
    """The definitions of the cell (or module file) `fn` was written in, calling `fn.__name__`."""
    filename = fn.__code__.co_filename
    lines = linecache.getlines(filename) or _file_lines(filename)
    if not lines:
        raise LiveCodeError(f"{kind} {fn.__name__!r}: cannot find its source ({filename}); define it in a cell or file")
    origin = _origin(filename, fn.__code__.co_firstlineno)
    return LiveCode(kind, fn.__name__, definitions("".join(lines), origin), origin)


def from_source(kind: str, source: str, origin: str = "cell", name: str | None = None) -> LiveCode:
    """A cell's text; the function is `name` or else the last top-level function the cell defines."""
    body = definitions(source, origin)
    functions = [n.name for n in ast.parse(body).body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    if name is None:
        if not functions:
            raise LiveCodeError(f"{kind} ({origin}): the cell defines no function; write `def {kind}(...):`")
        name = functions[-1]
    elif name not in functions:
        raise LiveCodeError(f"{kind} ({origin}): the cell defines no function {name!r}")
    return LiveCode(kind, name, body, origin)


def definitions(source: str, origin: str) -> str:
    """The top-level statements of `source` that define things and depend only on each other."""
    try:
        tree = ast.parse(source, filename=origin)
    except SyntaxError as e:
        raise LiveCodeError(f"({origin}), line {e.lineno}: SyntaxError: {e.msg}") from None
    defined = set(dir(builtins))
    kept = []
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            kept.append(node)
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            # Decorators run at definition time: keep the def only if they are self-contained too.
            if _uses_only(node.decorator_list, defined):
                kept.append(node)
                defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            if _uses_only([node.value], defined):
                kept.append(node)
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return "".join(ast.get_source_segment(source, n, padded=True) + "\n" for n in kept)


def compile_function(code: LiveCode) -> Callable:
    """Execute `code.source` in a fresh namespace and return its function `code.name`."""
    namespace: dict = {"__name__": f"forge_nb_live_{code.kind}"}
    exec(compile(code.source, code.origin, "exec"), namespace)
    fn = namespace.get(code.name)
    if not callable(fn):
        raise LiveCodeError(f"{code.kind} ({code.origin}): {code.name!r} is not a function after running the cell")
    return fn


def _uses_only(nodes: list[ast.AST], defined: set[str]) -> bool:
    loads = {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loads <= defined


def _file_lines(filename: str) -> list[str]:
    path = Path(filename)
    return path.read_text().splitlines(keepends=True) if path.is_file() else []


def _origin(filename: str, line: int) -> str:
    # ipykernel stores cells as /tmp/ipykernel_<pid>/<hash>.py; IPython as <ipython-input-N-...>.
    if "ipykernel_" in filename or filename.startswith("<"):
        return f"cell, line {line}"
    return f"{Path(filename).name}:{line}"
