"""What importing forge_nb sets up before Monarch loads: Monarch's own log file keeps warnings and errors only,
unless the environment says otherwise."""

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(("given", "seen"), [(None, "warn"), ("info", "info")])
def test_monarchs_file_log_keeps_warnings_unless_the_environment_says_otherwise(given, seen):
    env = {k: v for k, v in os.environ.items() if k != "MONARCH_FILE_LOG"}
    if given is not None:
        env["MONARCH_FILE_LOG"] = given
    code = "import os, forge_nb; print(os.environ['MONARCH_FILE_LOG'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == seen
