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


KILLED = textwrap.dedent(
    """
    import os, psutil, sys, forge_nb
    if __name__ == "__main__":
        s = forge_nb.up(prompts_per_step=2, group_size=2, threads_per_proc=1)
        server = psutil.Process(int(forge_nb.ps().loc[s.name, "pid"]))  # (a zygote's child, not this process's)
        procs = {server.pid, *(p.pid for p in server.children(recursive=True))}
        procs |= {p for ps in s.pids.values() for p in ps}
        print(" ".join(str(p) for p in procs), flush=True)
        sys.stdin.read()  # killed here, the mesh up: no atexit hook runs
    """
)


def test_a_process_killed_with_its_mesh_up_leaves_no_process(tmp_path):
    """SIGKILL to the process that holds a session: its server, its procs, the fork server and the procs it
    forked (which are not its descendants) all end by themselves."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    holder = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in holder.stdout.readline().split()]
        assert len(pids) >= 7, pids  # 3 actor procs, their 3 bootstrap clients, the fork server (and Monarch's)
    finally:
        holder.kill()
        holder.wait(30)
    gone, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=60)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == []
