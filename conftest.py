"""Suite-wide settings (tests/ and notebooks/): sessions use the plain-torch engine unless a test asks
for vLLM by name, so the suite does not pay vLLM's ~45 s start for every session; run directories
(rollout logs, trackers, periodic checkpoints) go to a temporary folder removed at the end, not into
the checkout. Kernels started by the tests inherit both."""

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("FORGE_NB_ENGINE", "torch")
if "FORGE_NB_RUNS" not in os.environ:
    os.environ["FORGE_NB_RUNS"] = _runs = tempfile.mkdtemp(prefix="forge_nb-runs-")
    atexit.register(shutil.rmtree, _runs, ignore_errors=True)
