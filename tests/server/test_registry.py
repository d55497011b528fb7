"""Where sessions are found (unit: no server)."""

from __future__ import annotations

import os
import stat
import time

import pytest

from forge_nb.server.registry import RegistryError, SessionDir, SessionInfo, private, runtime_dir, valid_name


def test_the_runtime_folder_is_made_private_and_one_of_another_user_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "runtime"
    monkeypatch.setenv("FORGE_NB_RUNTIME_DIR", str(folder))
    assert runtime_dir() == folder and stat.S_IMODE(folder.stat().st_mode) == 0o700
    os.chmod(folder, 0o755)
    runtime_dir()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # opened up by someone: closed again
    other = tmp_path / "theirs"
    other.mkdir()
    os.chown(other, 4242, 4242)  # (the suite runs as root; elsewhere: skip)
    with pytest.raises(RegistryError, match="belongs to uid 4242"):
        private(other)


def test_names_are_short_and_plain():
    assert valid_name("01_quickstart-3fa2") == "01_quickstart-3fa2"
    for bad in ("", "../x", "a/b", "-x", "x" * 65, "a b"):
        with pytest.raises(RegistryError, match="letters, digits"):
            valid_name(bad)


def test_a_session_folder_holds_a_private_key_and_its_info_and_refuses_a_running_name(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_NB_RUNTIME_DIR", str(tmp_path))
    folder = SessionDir.named("exp1")
    folder.create()
    assert len(folder.key()) == 32 and stat.S_IMODE((folder.path / "key").stat().st_mode) == 0o600
    folder.write_info(SessionInfo("exp1", os.getpid(), os.uname().nodename, time.time(), state="up", step=3))
    assert folder.info().step == 3 and folder.info().alive  # (this process stands for its server)
    with pytest.raises(RegistryError, match="is running"):
        SessionDir.named("exp1").create()
    folder.write_info(SessionInfo("exp1", 2**22 + 17, os.uname().nodename, time.time() - 7200, last_checkpoint="/c"))
    row = folder.info().row()
    assert row["state"] == "gone" and row["last_checkpoint"] == "/c" and row["age"] == "2.0 h"
    SessionDir.named("exp1").create()  # a gone session's name is free again: a new key
    folder.remove()
    assert not folder.path.exists()
