"""vLLM's start-up output goes to a log file, and into the error when the start fails (no vLLM needed)."""

from __future__ import annotations

import os

import pytest

from forge_nb.engines.vllm_engine import _output_to


def test_fd_level_output_goes_to_the_log_and_the_terminal_comes_back(tmp_path, capfd):
    log = tmp_path / "start.log"
    with _output_to(log):
        os.write(1, b"from C on stdout\n")
        os.write(2, b"from C on stderr\n")
    os.write(2, b"after\n")
    assert log.read_text() == "from C on stdout\nfrom C on stderr\n"
    assert capfd.readouterr().err == "after\n"


def test_a_failed_start_carries_the_tail_of_its_output(tmp_path):
    log = tmp_path / "start.log"
    with pytest.raises(RuntimeError, match=r"(?s)vLLM failed to start: ValueError: no such model.*why it failed"):
        with _output_to(log):
            os.write(2, b"why it failed\n")
            raise ValueError("no such model")
