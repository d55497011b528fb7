"""Capture live code as source: a cell, or the cell / module a function was defined in.

Live code travels as source, never as pickles. What travels is the *definitions* of the cell or
module -- imports, functions, classes, and assignments whose right-hand side only uses names the
same source defines -- so helpers and imports next to the function come along, while statements
that act on the kernel (``s.set_reward(reward)``, ``r = s.rollout()``) stay behind.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import linecache
import textwrap
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
    # A loss whose value and gradient on a sequence with advantage 0 are exactly 0 (the built-in
    # losses without KL): the trainer then leaves such sequences out of its forward and backward.
    zero_advantage_inert: bool = False


def from_function(kind: str, fn: Callable) -> LiveCode:
    """The definitions of the cell (or module file) `fn` was written in, calling `fn.__name__`."""
    if fn.__name__ == "<lambda>":
        raise LiveCodeError(f"{kind}: a lambda cannot travel as source; define it with `def {kind}(...):`")
    filename = fn.__code__.co_filename
    lines = linecache.getlines(filename) or _file_lines(filename)
    if not lines:
        raise LiveCodeError(f"{kind} {fn.__name__!r}: cannot find its source ({filename}); define it in a cell or file")
    origin = _origin(filename, fn.__code__.co_firstlineno)
    body = definitions("".join(lines), origin)
    if fn.__name__ not in _top_level_functions(body):
        # Defined inside another function: ship its own source after the module's definitions.
        own = textwrap.dedent(inspect.getsource(fn))
        body += definitions(own, origin, known=_defined_names(body), forge=_forge_names(body))
    return LiveCode(kind, fn.__name__, body, origin)


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
    (and on `known` names). forge_nb's own decorators (``@forge_nb.reward``) are dropped: in an
    actor they would try to register the function again."""
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
            if _uses_only([node.value], defined):
                kept.append(ast.get_source_segment(source, node))
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return "".join(segment + "\n" for segment in kept)


def compile_function(code: LiveCode) -> Callable:
    """Execute `code.source` in a fresh namespace and return its function `code.name`."""
    namespace: dict = {"__name__": f"forge_nb_live_{code.kind}"}
    exec(compile(code.source, code.origin, "exec"), namespace)
    fn = namespace.get(code.name)
    if not callable(fn):
        raise LiveCodeError(f"{code.kind} ({code.origin}): {code.name!r} is not a function after running the cell")
    return fn


def _imports_forge_nb(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] == "forge_nb"
    return any(a.name.split(".")[0] == "forge_nb" for a in node.names)


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute | ast.Call):
        node = node.value if isinstance(node, ast.Attribute) else node.func
    return node.id if isinstance(node, ast.Name) else None


def _top_level_functions(body: str) -> list[str]:
    return [n.name for n in ast.parse(body).body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _forge_names(body: str) -> set[str]:
    """Names the import statements of `body` bind to forge_nb or its members."""
    names = set()
    for node in ast.parse(body).body:
        if isinstance(node, ast.Import | ast.ImportFrom) and _imports_forge_nb(node):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _defined_names(body: str) -> set[str]:
    names = set()
    for node in ast.parse(body).body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        else:
            names |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return names


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
