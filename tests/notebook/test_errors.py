"""In a real kernel, an error meant for the user (a config that cannot be placed, no session up) shows
as its message and where it came from; `%tb` still shows the whole traceback; other errors keep
IPython's traceback."""

from __future__ import annotations

import re

import pytest

from forge_nb.notebook.errors import user_errors, where
from tests.notebook.kernel import Kernel

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    try:
        k.ok("%load_ext forge_nb")
        k.ok("import forge_nb")
        yield k
    finally:
        k.stop()


def _run(kernel, code):
    text, reply = kernel.run(code)
    return ANSI.sub("", text), reply


def test_a_config_error_is_its_message_and_where_it_came_from(kernel):
    text, reply = _run(kernel, "x = 1\nforge_nb.up(trainer_procs=3, trainer_hosts=2, mesh={'kind': 'slurm'}, nodes=3)")
    assert reply["status"] == "error" and reply["ename"] == "SessionError"
    lines = text.strip().splitlines()
    said = "SessionError: forge_nb: the mesh failed to start (ConfigError): mesh.trainer_procs=3 cannot be spread"
    assert lines[0].startswith(said)
    assert lines[1].startswith("  in cell line 2, forge_nb.up(") and "-> forge_nb/" in lines[1]
    assert lines[2] == "  (%tb shows the full traceback)" and len(lines) == 3
    full, _ = _run(kernel, "%tb")
    assert "forge_nb/session.py" in full and "forge_nb/launch/placement.py" in full and "ConfigError" in full
    assert len(full.splitlines()) > 10


def test_a_magic_without_a_session_says_so_in_one_line(kernel):
    text, reply = _run(kernel, "%forge step 1")
    assert reply["ename"] == "ForgeMagicError"
    lines = text.strip().splitlines()
    assert lines[0] == "ForgeMagicError: forge_nb: no session is up; run %forge up first"
    assert lines[1].startswith("  in cell line 1, %forge step 1 -> forge_nb/notebook/magics.py:")


def test_other_errors_keep_the_full_traceback(kernel):
    text, reply = _run(kernel, "def f():\n    return 1 / 0\nf()")
    assert reply["ename"] == "ZeroDivisionError" and "Traceback" in text and "(%tb shows" not in text


def test_where_names_the_users_line_and_forge_nbs_place():
    try:
        from forge_nb.config import Config

        Config().updated({"mesh.trainer_hosts": 0})
    except user_errors() as e:
        found = where(e.__traceback__)
    assert found.startswith("in test_errors.py:") and "-> forge_nb/config/sections.py:" in found


def test_the_user_errors_known_by_name_are_the_classes():
    from forge_nb.notebook.errors import USER_ERRORS

    assert {f"{c.__module__}:{c.__qualname__}" for c in user_errors()} == USER_ERRORS
