"""A real one-node Slurm cluster (Debian's slurm-wlm 22.05 + munge) for the tests, in a temp dir.

`LocalSlurm(root).start()` installs the packages when they are missing (apt-get), writes a munge key,
slurm.conf and the state/spool/log dirs under `root`, starts munged, slurmctld and slurmd in the
foreground as children of the test process, and waits until the node is idle. `stop()` cancels every
job and stops all three. Clients find the cluster through $SLURM_CONF, which `start()` sets.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = {"slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm", "munged": "munge"}


def ensure_installed() -> None:
    """apt-get install slurm-wlm and munge when any of their programs is missing."""
    missing = sorted({pkg for prog, pkg in PACKAGES.items() if shutil.which(prog) is None})
    if missing:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env, capture_output=True)


class LocalSlurm:
    """One node (this host, all its CPUs) in partition `debug`; a second partition `small` exists
    too, so tests can name a partition that is not the default."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.node = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.procs: list[subprocess.Popen] = []
        self.started = time.time()
        self._old_conf = os.environ.get("SLURM_CONF")

    def start(self, timeout: float = 60.0) -> LocalSlurm:
        ensure_installed()
        for d in ("munge", "state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        try:
            self._start_munge()
            self.conf.write_text(self._slurm_conf())
            os.environ["SLURM_CONF"] = str(self.conf)
            self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
            self._spawn(["slurmd", "-D", "-f", str(self.conf)], "slurmd")
            self._wait_idle(timeout)
        except BaseException:  # a cluster that did not come up leaves no daemon behind (e.g. its port was taken)
            self._stop_daemons()
            raise
        return self

    def _start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        m = self.root / "munge"
        self._spawn(
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--pid-file={m / 'munged.pid'}",
                f"--seed-file={m / 'munged.seed'}",
            ],
            "munged",
        )
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start: {(self.root / 'log' / 'munged.log').read_text()}")
            time.sleep(0.1)

    def _slurm_conf(self) -> str:
        cpus = os.cpu_count() or 1
        mem_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20) - 1024
        r = self.root
        return f"""ClusterName=forge_nb_test
SlurmctldHost={self.node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SchedulerType=sched/backfill
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mib} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
PartitionName=small Nodes={self.node} Default=NO MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""

    def _spawn(self, cmd: list[str], name: str) -> None:
        log = open(self.root / "log" / f"{name}.stdout", "wb")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.split() and all(s == "idle" for s in out.stdout.split()):
                return
            time.sleep(0.5)
        logs = {p.name: p.read_text()[-2000:] for p in (self.root / "log").glob("*") if p.is_file()}
        raise RuntimeError(f"the local Slurm node did not become idle in {timeout} s: {logs}")

    @property
    def daemons(self) -> frozenset[int]:
        """Pids of munged, slurmctld (and its helper slurmscriptd) and slurmd themselves; job steps
        under slurmd are not in it, so a test sees a job's processes that outlive the job."""
        import psutil

        pids = {p.pid for p in self.procs}
        for p in self.procs:
            try:
                pids |= {c.pid for c in psutil.Process(p.pid).children() if c.name() == "slurmscriptd"}
            except psutil.NoSuchProcess:
                pass
        return frozenset(pids)

    def jobs(self) -> list[str]:
        """Ids of the jobs still in the queue (pending or running)."""
        out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True)
        return out.stdout.split()

    def wait_no_jobs(self, timeout: float = 30.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while (left := self.jobs()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left

    def stray_steps(self) -> list:
        """slurmstepd processes started since this cluster started, with their descendants."""
        import psutil

        steps = []
        for p in psutil.process_iter(["name", "create_time"]):
            if p.info["name"] == "slurmstepd" and p.info["create_time"] >= self.started - 1:
                try:
                    steps += [p, *p.children(recursive=True)]
                except psutil.NoSuchProcess:
                    pass
        return steps

    def live_steps(self, timeout: float = 15.0) -> list:
        """Wait up to `timeout` s for every job step process to exit -> those still running."""
        import psutil

        def alive() -> list:
            out = []
            for p in self.stray_steps():
                try:
                    if p.status() != psutil.STATUS_ZOMBIE:
                        out.append(p)
                except psutil.NoSuchProcess:
                    pass
            return out

        deadline = time.monotonic() + timeout
        while (left := alive()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def _kill_stray_steps(self) -> None:
        for p in self.stray_steps():
            try:
                p.kill()
            except Exception:
                pass

    def stop(self) -> None:
        """Cancel every job and wait for it to leave, stop the daemons, then kill any job step that
        outlived them (slurmstepd daemonizes: it is nobody's child, so only its start time ties it
        to this cluster)."""
        subprocess.run(["scancel", "--full", "--user", "root"], capture_output=True)
        self.wait_no_jobs()
        self._stop_daemons()
        self._kill_stray_steps()

    def _stop_daemons(self) -> None:
        """Stop the daemons this cluster started (and put SLURM_CONF back)."""
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self._old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = self._old_conf
