"""Build the prebuilt extension into forge_nb/labextension, against the JupyterLab of this Python.

It runs `jupyter-builder build` (in JupyterLab 4.6, `jupyter labextension build` is a deprecated alias
that calls it), which runs the pinned @jupyterlab/builder from node_modules. Given no core package
file, jupyter-builder would download the one of the builder's own version from the network; this
passes the installed JupyterLab's instead, so the shared packages match the JupyterLab that will
load the extension and the build needs no network. install.json then marks the output as shipped by forge_nb
(`jupyter labextension list` shows "python, forge_nb").

Run from the extension's folder with the venv's Python: `python scripts/build_labextension.py`.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jupyterlab

HERE = Path(__file__).resolve().parent.parent


def main() -> int:
    core = Path(jupyterlab.__file__).parent / "staging" / "package.json"
    builder = Path(sys.executable).parent / "jupyter-builder"
    code = subprocess.call([str(builder), "build", "--core-package-file", str(core), str(HERE)])
    if code == 0:
        out = (HERE / json.loads((HERE / "package.json").read_text())["jupyterlab"]["outputDir"]).resolve()
        shutil.copy(HERE / "install.json", out / "install.json")
    return code


if __name__ == "__main__":
    sys.exit(main())
