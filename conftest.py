"""Suite-wide settings (tests/ and notebooks/): sessions use the plain-torch engine unless a test asks
for vLLM by name, so the suite does not pay vLLM's ~45 s start for every session. Kernels started by
the tests inherit it."""

import os

os.environ.setdefault("FORGE_NB_ENGINE", "torch")
