import subprocess
import sys

from tests.conftest import child_processes

CLI = [sys.executable, "-m", "forge_nb.cli"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


def test_demo_prints_a_table_and_held_out_accuracy_before_and_after():
    out = _run("demo", "--steps", "2", "--every", "1", "--set", "prompts_per_step=4", "group_size=4")
    assert out.returncode == 0, out.stderr
    assert "held-out accuracy before:" in out.stdout
    assert "held-out accuracy after:" in out.stdout
    for column in ("mean_reward", "accuracy", "tokens_per_s", "train_s", "refresh_gbps"):
        assert column in out.stdout
    assert "2-2" in out.stdout  # the second step's row
    assert "leaked" not in out.stdout + out.stderr  # frozen heaps thawed at exit: no extension's leak report


def test_demo_with_an_unknown_field_fails_fast_with_the_field_named():
    out = _run("demo", "--set", "group_sise=4")
    assert out.returncode != 0
    assert "unknown config field 'group_sise'; did you mean algorithm.group_size?" in out.stderr
    assert "Traceback" not in out.stderr
    assert child_processes() == []


def test_bench_names_the_known_benchmarks_when_one_is_missing():
    out = _run("bench", "no_such_benchmark")
    assert out.returncode != 0
    assert "overhead" in out.stderr


def test_bench_outside_a_source_checkout_says_it_needs_one(monkeypatch):
    import pytest

    from forge_nb import cli

    monkeypatch.setattr(cli, "benchmarks_dir", lambda: None)
    with pytest.raises(SystemExit, match="the benchmarks ship with the source, not the installed package"):
        cli.bench("overhead", [])


def test_bench_runs_a_benchmark_that_imports_a_sibling(tmp_path, monkeypatch, capsys):
    from forge_nb import cli

    (tmp_path / "sibling.py").write_text("ANSWER = 42\n")
    (tmp_path / "uses_sibling.py").write_text("import sys\nfrom sibling import ANSWER\nprint(ANSWER, sys.argv[1:])\n")
    monkeypatch.setattr(cli, "benchmarks_dir", lambda: tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    cli.bench("uses_sibling", ["--hosts"])
    assert capsys.readouterr().out.strip() == "42 ['--hosts']"
