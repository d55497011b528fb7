"""`make gpu-check` here: without a GPU it says so and exits 0; its code runs end to end on the CPU (the same
modules, tiny model: every row present, the FSDP2 row's first step equal to the plain one's, its files
loaded and saved by rows, the refreshed weights the trainer's)."""

import subprocess
import sys

import pytest

from forge_nb.tools.gpu_check import main

pytestmark = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU here: make gpu-check runs it")


def test_without_a_gpu_it_says_so_and_exits_0(capsys):
    assert main([]) == 0
    assert "no CUDA device here" in capsys.readouterr().out


def test_every_part_runs_on_the_cpu_with_a_tiny_model():
    tiny = "--width 64 --layers 2 --vocab 256 --prompts 2 --group 2 --prompt-len 8 --completion-len 8 --micro 16"
    argv = [sys.executable, "-m", "forge_nb.tools.gpu_check", "--device", "cpu", *tiny.split(), "--steps", "1"]
    run = subprocess.run([*argv, "--reps", "2"], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line.split()[0] for line in run.stdout.splitlines() if line.split()[:1]]
    assert rows.count("trainer") == 6 and rows.count("generator") == 2 and "FAILED" not in rows
    assert "served == trainer's" in run.stdout
    assert rows.count("files") == 2 and "by rows: True" in run.stdout and "saved == trainer's: True" in run.stdout
    fsdp = next(line for line in run.stdout.splitlines() if "FSDP2 x1, fp32" in line)
    ours, plain = fsdp.split("1st step: loss ")[1].split("; plain: ")
    assert ours.split(" grad ") == plain.split(", ")  # the same digits
