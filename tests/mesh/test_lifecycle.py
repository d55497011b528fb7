import subprocess
import sys
import textwrap

import psutil

SCRIPT = textwrap.dedent(
    """
    import forge_nb
    if __name__ == "__main__":
        s = forge_nb.up(prompts_per_step=2, group_size=2, threads_per_proc=1)
        print(" ".join(str(p) for ps in s.pids.values() for p in ps), flush=True)
        # exit without s.down(): the atexit hook must stop the mesh
    """
)


def test_interpreter_exit_stops_the_mesh(tmp_path):
    script = tmp_path / "leave_up.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    pids = [int(p) for p in out.stdout.split()[-3:]]
    assert len(pids) == 3
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
