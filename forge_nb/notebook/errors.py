"""Errors meant for the user render in a notebook as their message and where it came from, not as a
traceback through forge_nb's internals; ``%tb`` still shows the whole traceback.

A refused reward cell, a config that cannot be placed, a host that is gone: the one-line message is the
feature, and a 40-line traceback through the session, the mesh and Monarch buried it at the bottom. The
extension registers `render` for `user_errors()` (IPython's ``set_custom_exc``): the cell's output is

    LiveCodeError: reward 'r' returned str, expected a float
      in cell line 3, s.set_reward(...) -> forge_nb/live/validate.py:88
      (%tb shows the full traceback)

Any other exception (a bug, a user's own error) keeps IPython's full traceback.
"""

from __future__ import annotations

import re
import sys
import traceback
from pathlib import Path
from typing import Any

PACKAGE = str(Path(__file__).resolve().parents[1])  # .../forge_nb
RED, BOLD, RESET = "\x1b[31m", "\x1b[1m", "\x1b[0m"


class ForgeMagicError(ValueError):
    """A magic used wrongly; the message says the right form."""


#: forge_nb's exceptions whose message says what went wrong and what to do, by module and name: the kernel need not
#: import their modules (torch, Monarch) to recognise one (`user_errors()` has the classes; a test keeps the two
#: equal).
USER_ERRORS = frozenset(
    {
        "forge_nb.config.sections:ConfigError",
        "forge_nb.errors:SessionError",
        "forge_nb.live.capture:LiveCodeError",
        "forge_nb.models.registry:ModelError",
        "forge_nb.loop:RunError",
        "forge_nb.weights.refresh:RefreshError",
        "forge_nb.weights.refresh:TornWeights",
        "forge_nb.engines.base:WeightsRefused",
        "forge_nb.fleet.recovery:TrainerLost",
        "forge_nb.fleet.recovery:CheckpointLost",
        "forge_nb.launch.hosts:HostLost",
        "forge_nb.launch.hosts:HostsError",
        "forge_nb.launch.credentials:CredentialsError",
        "forge_nb.launch.slurm:SlurmError",
        "forge_nb.agents.client:ConversationError",
        "forge_nb.agents.trajectory:TemplateRewriteError",
        "forge_nb.agents.tools:UnknownToolError",
        "forge_nb.notebook.errors:ForgeMagicError",
        "forge_nb.server.registry:RegistryError",
    }
)


def is_user_error(error: BaseException) -> bool:
    """Whether `error` is one of `USER_ERRORS` (or a subclass of one)."""
    return any(f"{c.__module__}:{c.__qualname__}" in USER_ERRORS for c in type(error).__mro__)


def user_errors() -> tuple[type[BaseException], ...]:
    """forge_nb's exceptions whose message says what went wrong and what to do."""
    from forge_nb.agents.client import ConversationError
    from forge_nb.agents.tools import UnknownToolError
    from forge_nb.agents.trajectory import TemplateRewriteError
    from forge_nb.config import ConfigError
    from forge_nb.engines.base import WeightsRefused
    from forge_nb.errors import SessionError
    from forge_nb.fleet.recovery import CheckpointLost, TrainerLost
    from forge_nb.launch.credentials import CredentialsError
    from forge_nb.launch.hosts import HostLost, HostsError
    from forge_nb.launch.slurm import SlurmError
    from forge_nb.live.capture import LiveCodeError
    from forge_nb.loop import RunError
    from forge_nb.models.registry import ModelError
    from forge_nb.server.registry import RegistryError
    from forge_nb.weights.refresh import RefreshError, TornWeights

    return (
        ConfigError,
        SessionError,
        LiveCodeError,
        ModelError,
        RunError,
        RefreshError,
        TornWeights,
        WeightsRefused,
        TrainerLost,
        CheckpointLost,
        HostLost,
        HostsError,
        CredentialsError,
        SlurmError,
        ConversationError,
        TemplateRewriteError,
        UnknownToolError,
        ForgeMagicError,
        RegistryError,
    )


def server_place(error: BaseException) -> str | None:
    """Where in forge_nb an error raised in the session's server came from ("forge_nb/live/validate.py:88"),
    read from the server's traceback its client attached as the cause; None for an error raised here."""
    cause = error.__cause__
    if type(cause).__name__ != "ServerTraceback":
        return None
    places = re.findall(r'File "[^"]*/(forge_nb/[^"]+\.py)", line (\d+)', str(cause))
    return f"{places[-1][0]}:{places[-1][1]}" if places else None


def where(tb: Any, server: str | None = None) -> str:
    """ "in cell line 3, s.set_reward(...) -> forge_nb/live/validate.py:88": the user's last line (a cell or
    their own module) and the place in forge_nb that raised (`server`: in the session's server)."""
    frames = traceback.extract_tb(tb)
    if not frames:
        return ""
    ours = [f for f in frames if f.filename.startswith(PACKAGE)]
    theirs = [f for f in frames if not f.filename.startswith(PACKAGE) and "site-packages" not in f.filename]
    parts = []
    if theirs:
        user = theirs[-1]
        place = f"cell line {user.lineno}" if _is_cell(user.filename) else f"{Path(user.filename).name}:{user.lineno}"
        code = _as_typed((user.line or "").strip())
        parts.append(f"in {place}" + (f", {code}" if code else ""))
    if server is not None:
        parts.append(f"{server} (in the session's server)")
    elif ours:
        raised = ours[-1]
        parts.append(f"{Path(raised.filename).relative_to(Path(PACKAGE).parent)}:{raised.lineno}")
    return " -> ".join(parts)


def _as_typed(code: str) -> str:
    """A magic's line as the user typed it (IPython runs ``get_ipython().run_line_magic('forge', 'up')``)."""
    magic = re.match(r"get_ipython\(\)\.run_(line|cell)_magic\('(\w+)', '([^']*)'", code)
    if magic is None:
        return code
    kind, name, args = magic.groups()
    return f"{'%' if kind == 'line' else '%%'}{name} {args}".rstrip()


def _is_cell(filename: str) -> bool:
    return filename.startswith("<ipython-input") or "/ipykernel_" in filename or filename.startswith("<cell")


def render(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> list[str] | None:
    """IPython's custom exception handler: for a forge_nb user error, show the message and where it came from
    (the error output a notebook stores), and keep the exception for ``%tb``; any other exception is shown as
    IPython shows it."""
    if not is_user_error(value):
        if issubclass(etype, SyntaxError):  # (raised while the cell is parsed)
            shell.showsyntaxerror()
        else:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)
        return None
    sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb  # what %tb (showtraceback) shows
    if hasattr(sys, "last_exc"):
        sys.last_exc = value
    stb = [f"{RED}{BOLD}{etype.__name__}{RESET}: {value}"]
    found = where(tb, server_place(value))
    if found:
        stb.append(f"  {found}")
    stb.append("  (%tb shows the full traceback)")
    shell._showtraceback(etype, value, stb)
    return stb


def register(shell: Any) -> None:
    """Render forge_nb's user errors short in this shell (`render`); other exceptions as before. Every exception
    comes to `render`, which tells a user error by its class's name: recognising one needs no import here."""
    shell.set_custom_exc((Exception,), render)
