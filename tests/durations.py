"""Write tests/durations.json (seconds per test file, which conftest.py runs longest first) from the
JUnit XML of a measured run: `make test PYTEST_ARGS=--junitxml=/tmp/junit.xml`, then
`python tests/durations.py /tmp/junit.xml`."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).parent / "durations.json"


def per_file(junit: Path) -> dict[str, float]:
    """Seconds per test file (a notebook's cells add up to its file) from a JUnit XML report."""
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).iter("testcase"):
        seconds[_file(case.get("classname", ""))] += float(case.get("time", 0.0))
    return dict(seconds)


def _file(classname: str) -> str:
    """ "tests.weights.test_shards" -> "tests/weights/test_shards.py"; a notebook's cells: its .ipynb."""
    if classname.endswith(".ipynb"):
        return classname.removesuffix(".ipynb").replace(".", "/") + ".ipynb"
    return classname.replace(".", "/") + ".py"


def main() -> None:
    found = per_file(Path(sys.argv[1]))
    OUT.write_text(json.dumps({k: round(v, 1) for k, v in sorted(found.items())}, indent=1) + "\n")
    print(f"{len(found)} files, {sum(found.values()):.0f} s in all -> {OUT}")


if __name__ == "__main__":
    main()
