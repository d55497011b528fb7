"""Run every test file and tutorial alone, each in a fresh pytest process (`make test-each`).

A test that passes only after another one (its module fixture set up by an earlier test, a session a
previous file left) proves less than it says; this runs each file on its own, `--workers` at a time
(the files that start the local Slurm one at a time: fixed ports), and prints one row per file:
result, tests passed / failed, seconds. Exit status 1 if any file failed.

    python tests/each_file.py [--workers 2] [FILE ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The environment as it was before conftest's import, which points this process at a suite temp folder of its
#: own (tests/suite_tmp.py: TMPDIR, the run's folder, its sessions' runtime folder): each file's run makes its
#: own, or two runs at once would share one, see each other's leftovers and attach to each other's sessions.
ENV = dict(os.environ)
sys.path.insert(0, str(ROOT))
from conftest import file_group  # noqa: E402  (the suite's own grouping says which files start Slurm)

COUNTS = re.compile(r"(\d+) (passed|failed|skipped|error|errors)")


def test_files() -> list[Path]:
    """Every test module under tests/ and every tutorial, in file order."""
    return sorted((ROOT / "tests").rglob("test_*.py")) + sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def run_alone(path: Path, slurm: threading.Lock, cache: dict) -> tuple[str, int, dict[str, int], float, str]:
    """pytest on `path` alone -> (file, exit status, counts by outcome, seconds, output tail)."""
    with slurm if file_group(path, ROOT, cache) == "slurm" else contextlib.nullcontext():
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path.relative_to(ROOT))],
            cwd=ROOT,
            env=ENV,
            capture_output=True,
            text=True,
        )
        seconds = time.monotonic() - start
    summary = done.stdout.splitlines()[-1] if done.stdout else ""
    counts = {kind.rstrip("s"): int(n) for n, kind in COUNTS.findall(summary)}
    rel = path.relative_to(ROOT).as_posix()
    return rel, done.returncode, counts, seconds, (done.stdout + done.stderr)[-3000:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("files", nargs="*", type=Path)
    args = parser.parse_args()
    files = [p.resolve() for p in args.files] or test_files()
    slurm, cache, failed = threading.Lock(), {}, []
    start = time.monotonic()
    print(f"{'file':<52} {'result':>6} {'passed':>6} {'failed':>6} {'seconds':>8}", flush=True)
    with ThreadPoolExecutor(args.workers) as pool:
        for rel, rc, counts, seconds, tail in pool.map(lambda p: run_alone(p, slurm, cache), files):
            ok = rc in (0, 5)  # 5: nothing collected (every test skipped at collection)
            bad = counts.get("failed", 0) + counts.get("error", 0)
            result = "ok" if ok else "FAIL"
            print(f"{rel:<52} {result:>6} {counts.get('passed', 0):>6} {bad:>6} {seconds:>8.1f}", flush=True)
            if not ok:
                failed.append((rel, tail))
    for rel, tail in failed:
        print(f"\n===== {rel} =====\n{tail}")
    print(f"\n{len(files) - len(failed)} of {len(files)} files pass alone; {time.monotonic() - start:.0f} s in all")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
