"""A host worker in miniature for tests/launch/forks/test_on_workers.py: it starts procs as Monarch's worker does,
as its own children with the bootstrap command ``forkclient --worker`` (on `tests.launch.forks.forked_main`).

Each line on standard input: a JSON list of environments; the worker starts one proc per environment, all
at once, and prints a JSON line: each proc's exit code and what it printed. It exits at end of input.
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

COMMAND = [sys.executable, "-m", "forge_nb.launch.forks.client", "--worker", "tests.launch.forks.forked_main"]


def proc(env: dict) -> list:
    done = subprocess.run(COMMAND, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    return [done.returncode, json.loads(done.stdout) if done.stdout else done.stderr[-2000:]]


if __name__ == "__main__":
    print(json.dumps({"pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        envs = json.loads(line)
        with ThreadPoolExecutor(len(envs)) as pool:
            print(json.dumps(list(pool.map(proc, envs))), flush=True)
