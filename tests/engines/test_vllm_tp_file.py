"""`forge_nb.engines.vllm_tp` without vLLM: the weights file a refresh writes for several ranks, read back as a
rank reads it (by its /proc path, from another process); a failed write leaves no descriptor open."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from forge_nb.engines import vllm_tp

READER = """
import sys, json, torch
from forge_nb.engines import vllm_tp
class Rank:
    def reload_weights(self, weights_iterator):
        print(json.dumps({n: [str(t.dtype), t.double().flatten().tolist()] for n, t in weights_iterator}))
vllm_tp.reload_from_file(Rank(), sys.argv[1], json.loads(sys.argv[2]))
"""


def test_a_rank_in_another_process_reads_back_every_tensor_as_written():
    import json

    tensors = [("w", torch.randn(3, 5)), ("b", torch.ones(4, dtype=torch.bfloat16)), ("i", torch.arange(7))]
    fd, path, layout = vllm_tp.write_weights(iter(tensors))
    try:
        read = subprocess.run([sys.executable, "-c", READER, path, json.dumps(layout)], capture_output=True, text=True)
    finally:
        os.close(fd)
    got = json.loads(read.stdout)
    assert list(got) == ["w", "b", "i"] and all(offset % vllm_tp.ALIGN == 0 for offset, *_ in layout.values())
    for name, t in tensors:
        assert got[name] == [str(t.dtype), t.double().flatten().tolist()]


def test_a_write_that_fails_leaves_no_descriptor_open():
    def tensors():
        yield "w", torch.ones(2)
        raise RuntimeError("the refresh failed mid-way")

    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(RuntimeError, match="mid-way"):
        vllm_tp.write_weights(tensors())
    assert set(os.listdir("/proc/self/fd")) <= before
