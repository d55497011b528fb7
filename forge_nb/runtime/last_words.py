"""Why a proc ended itself, for the report of its death.

Monarch reports a proc that calls ``os._exit(1)`` as "exited with non-zero code 1"; what made it end
(a generator whose vLLM rank died: `actors.generator`) is on its stderr only. A proc that ends itself
first says why (`say`: a file named by its pid in a folder of this host's temp dir); the session, when
it replaces the role, adds what its dead procs of this host said to the cause it reports (`with_words`), and
`down` drops what nobody reported. Each proc clears its pid's file when it starts (`forget`), so words left by
an earlier proc with the same pid are never read as its own. A proc on another host leaves its words there:
the cause is then Monarch's alone.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path


def folder() -> Path:
    """<tmp>/forge_nb-last-words-<uid>: this user's, on this host."""
    return Path(tempfile.gettempdir()) / f"forge_nb-last-words-{os.getuid()}"


def forget() -> None:
    """At a proc's start: no words are this proc's yet."""
    try:
        (folder() / str(os.getpid())).unlink(missing_ok=True)
    except Exception:  # noqa: BLE001 - an unusable temp dir must not stop a proc from starting
        pass


def say(why: str) -> None:
    """Before this proc ends itself: `why` (one line), for whoever reports its death."""
    try:
        folder().mkdir(mode=0o700, exist_ok=True)
        written = folder() / f".{os.getpid()}.part"
        written.write_text(why)
        written.replace(folder() / str(os.getpid()))  # whole or not at all
    except Exception:  # noqa: BLE001 - a full or read-only temp dir: the proc still ends, with Monarch's report alone
        pass


def heard(pids: Iterable[int]) -> list[str]:
    """What the procs `pids` of this host said before they ended (each file read once, then removed)."""
    try:
        if folder().stat().st_uid != os.getuid():  # another user's folder: nothing in it is our procs' words
            return []
    except OSError:  # no proc of this user has said anything here
        return []
    words = []
    for pid in pids:
        path = folder() / str(pid)
        try:
            words.append(path.read_text().strip())
            path.unlink()
        except OSError:  # it said nothing (killed, lost its host)
            continue
    return [w for w in words if w]


def with_words(cause: str, pids: Iterable[int]) -> str:
    """`cause` (Monarch's report), then what the procs said: "exited with non-zero code 1; generator (pid 12): why"."""
    return "; ".join([cause, *heard(pids)])
