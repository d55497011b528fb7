"""Last words: what a proc that ends itself said reaches the report of its death, once, and never as the words
of a later proc with the same pid."""

from __future__ import annotations

import subprocess
import sys

from forge_nb.runtime import last_words

SAYS = (
    "from forge_nb.runtime import last_words; import os; last_words.say('generator: its engine is lost'); os._exit(1)"
)
STARTS = "from forge_nb.runtime import last_words; last_words.forget()"


def test_what_a_proc_said_before_it_ended_is_added_to_the_cause_once():
    proc = subprocess.Popen([sys.executable, "-c", SAYS])
    assert proc.wait(timeout=60) == 1
    cause = "the process this actor was running on failed: exited with non-zero code 1"
    assert last_words.with_words(cause, [proc.pid]) == f"{cause}; generator: its engine is lost"
    assert last_words.with_words(cause, [proc.pid]) == cause  # read once


def test_a_proc_that_said_nothing_leaves_the_cause_as_it_is():
    quiet = subprocess.Popen([sys.executable, "-c", STARTS])
    assert quiet.wait(timeout=60) == 0
    assert last_words.with_words("Killed(sig=9)", [quiet.pid, 2**22 + 17]) == "Killed(sig=9)"


def test_a_starting_proc_clears_words_an_earlier_proc_with_its_pid_left(monkeypatch):
    monkeypatch.setattr(last_words.os, "getpid", lambda: 2**22 + 11)  # an earlier proc with this pid spoke
    last_words.say("an earlier proc's words")
    last_words.forget()  # this proc (the same pid) starts
    assert last_words.heard([2**22 + 11]) == []
