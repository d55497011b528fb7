"""A real multi-node Slurm cluster (Debian's slurm-wlm 22.05 + munge) on this machine, for the tests.

Every node runs its own slurmd with a UTS namespace of its own whose host name is the node's name
(``fnode1`` ...) and a hosts file naming every node (bind-mounted over /etc/hosts inside it: no file of
this machine changes). ``fnode2`` ... are hosts of `forge_nb.testing.netns_hosts` (a network namespace
each, on one bridge, with a /dev/shm of their own): nothing but the network joins them to the rest.
``fnode1`` is this machine's own network (at the bridge's address), as a login node that also
computes: a kernel that already runs Monarch over Unix sockets (a local session first) can still drive a
job on it, as on a one-node cluster; a job that spans the other nodes needs a kernel whose Monarch runs
over TCP (`SlurmMesh`). slurmctld and munged run in the root namespace (slurmctld at the bridge's
address, which every node reaches; munge's socket is a path, which namespaces share). Slurm allocates
separate nodes and `srun` starts a job's tasks inside them.

`LocalSlurm(root, nodes=3).start()` installs the packages when missing (apt-get), writes the munge key,
slurm.conf and the state/spool/log dirs under `root`, starts the daemons in the foreground as children
of the test process and waits until every node is idle. `stop()` cancels every job and stops all of
them, and removes the namespaces. Clients find the cluster through $SLURM_CONF, which `start()` sets.

Partitions: `debug` (default) and `small` hold node 1 (one-node jobs land on the same node every time);
`multi` holds every node.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from forge_nb.testing import netns_hosts

PACKAGES = {"slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm", "munged": "munge"}
CTLD_PORT, SLURMD_PORT = 16817, 16818  # slurmctld's in the root namespace (one cluster at a time); slurmd's per node


def ensure_installed() -> None:
    """apt-get install slurm-wlm and munge when any of their programs is missing."""
    missing = sorted({pkg for prog, pkg in PACKAGES.items() if shutil.which(prog) is None})
    if missing:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env, capture_output=True)


def queued_jobs() -> list[str]:
    """Ids of the jobs in the queue of the cluster $SLURM_CONF names (pending or running)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True)
    return out.stdout.split()


def unavailable_reason() -> str | None:
    """Why the cluster cannot be made here (its nodes are network namespaces), or None."""
    return netns_hosts.unavailable_reason()


class LocalSlurm:
    """`nodes` (>= 2) Slurm nodes ``fnode1`` ... (this machine, then namespace hosts), each with this
    machine's CPUs."""

    def __init__(self, root: Path, nodes: int = 3) -> None:
        self.root = root
        self.net = netns_hosts.HostNet(nodes - 1, f"s{os.getpid() % 100000}")
        self.nodes = [f"fnode{i}" for i in range(1, nodes + 1)]
        self.addresses = [self.net.gateway] + [h.ip for h in self.net.hosts]
        self.node = self.nodes[0]
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        self.procs: list[subprocess.Popen] = []
        self.slurmd: dict[str, subprocess.Popen] = {}
        self.started = time.time()
        self._old_conf = os.environ.get("SLURM_CONF")

    def host(self, node: str) -> netns_hosts.Host:
        """The namespace host node `node` runs in (not fnode1: this machine's own network)."""
        if node == self.node:
            raise ValueError(f"{node} runs in this machine's network, not in a namespace host")
        return self.net.hosts[self.nodes.index(node) - 1]

    def start(self, timeout: float = 90.0) -> LocalSlurm:
        ensure_installed()
        for d in ("munge", "state", "log", *(f"spool/{n}" for n in self.nodes)):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        try:
            self.net.up()
            self._write_hosts()
            self._start_munge()
            self.conf.write_text(self._slurm_conf())
            os.environ["SLURM_CONF"] = str(self.conf)
            self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
            for node in self.nodes:
                self.start_node(node)
            self._wait_idle(timeout)
        except BaseException:  # a cluster that did not come up leaves nothing behind (e.g. its port was taken)
            self._stop_daemons()
            raise
        return self

    def _write_hosts(self) -> None:
        lines = ["127.0.0.1 localhost"] + [f"{a} {n}" for n, a in zip(self.nodes, self.addresses)]
        (self.root / "hosts").write_text("\n".join(lines) + "\n")

    def start_node(self, node: str) -> None:
        """Start node `node`'s slurmd (its host name and hosts file its own; on a namespace host, its
        network and /dev/shm too)."""
        hosts = f"mount --bind {self.root / 'hosts'} /etc/hosts"
        shm = "" if node == self.node else "mount -t tmpfs tmpfs /dev/shm && "
        inside = f'hostname {node} && {hosts} && {shm}exec slurmd -D -f "{self.conf}"'
        cmd = ["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", inside]
        if node != self.node:
            # nsenter, not `ip netns exec`: that one mounts a fresh /sys, hiding the cgroup mounts slurmd needs
            cmd = ["nsenter", f"--net=/run/netns/{self.host(node).netns}", *cmd]
        self.slurmd[node] = self._spawn(cmd, f"slurmd-{node}")

    def kill_node(self, node: str) -> None:
        """Node `node` dies: every process in its namespace (slurmd, job steps, workers, procs) SIGKILLed."""
        netns_hosts.kill_inside(self.host(node).netns)

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
        nodes = "\n".join(
            f"NodeName={n} NodeAddr={a} CPUs={cpus} RealMemory={mem_mib} State=UNKNOWN"
            for n, a in zip(self.nodes, self.addresses)
        )
        every = ",".join(self.nodes)
        # SlurmdTimeout: a node whose slurmd stops answering is DOWN after 10 s (300 s by default), so the
        # node-loss tests see Slurm's own verdict; %n: each node's slurmd has its own spool, pid and log.
        return f"""ClusterName=forge_nb_test
SlurmctldHost={socket.gethostname().split(".")[0]}({self.net.gateway})
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
SlurmdTimeout=10
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
SchedulerType=sched/backfill
{nodes}
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
PartitionName=small Nodes={self.node} Default=NO MaxTime=INFINITE State=UP OverSubscribe=FORCE
PartitionName=multi Nodes={every} Default=NO MaxTime=INFINITE State=UP OverSubscribe=FORCE
"""

    def _spawn(self, cmd: list[str], name: str) -> subprocess.Popen:
        log = open(self.root / "log" / f"{name}.stdout", "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo reports it (idle, mixed, allocated, down*, ...)."""
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True)
        return dict(line.split() for line in out.stdout.splitlines() if line.strip()) if out.returncode == 0 else {}

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.node_states()
            if sorted(states) == sorted(self.nodes) and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.5)
        logs = {p.name: p.read_text()[-2000:] for p in (self.root / "log").glob("*") if p.is_file()}
        raise RuntimeError(f"the local Slurm nodes did not become idle in {timeout} s: {logs}")

    @property
    def daemons(self) -> frozenset[int]:
        """Pids of munged, slurmctld (and its helper slurmscriptd) and each slurmd; job steps under
        slurmd are not in it, so a test sees a job's processes that outlive the job."""
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
        return queued_jobs()

    def wait_no_jobs(self, timeout: float = 30.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while (left := self.jobs()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left

    def run_batch(self, script: Path, timeout: float = 400.0) -> str:
        """sbatch `script`, wait until its job has left the queue -> ``scontrol show job`` of it (JobState,
        ExitCode); raises when sbatch refuses it or the job is still queued after `timeout` s."""
        submitted = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
        job = submitted.stdout.strip().split(";")[0]
        if submitted.returncode != 0 or not job:
            raise RuntimeError(f"sbatch refused {script}: {submitted.stderr}")
        if self.wait_no_jobs(timeout=timeout):
            raise RuntimeError(f"job {job} of {script} still queued after {timeout} s")
        return subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout

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

    def procs_on_nodes(self, timeout: float = 0.0) -> dict[str, list[int]]:
        """Each node -> the pids running on it (in its UTS namespace) but its slurmd, once there are none or
        after `timeout` s."""
        deadline = time.monotonic() + timeout
        found = self._procs_on_nodes()
        while any(found.values()) and time.monotonic() < deadline:
            time.sleep(0.5)
            found = self._procs_on_nodes()
        return found

    def _procs_on_nodes(self) -> dict[str, list[int]]:
        import psutil

        def uts(pid: int) -> str | None:
            try:
                return os.readlink(f"/proc/{pid}/ns/uts")
            except OSError:
                return None

        spaces = {uts(p.pid): n for n, p in self.slurmd.items() if p.poll() is None}
        found: dict[str, list[int]] = {n: [] for n in self.nodes}
        ours = {p.pid for p in self.slurmd.values()}
        for pid in psutil.pids():
            node = spaces.get(uts(pid))
            if node is not None and pid not in ours:
                found[node].append(pid)
        return found

    def restore_node(self, node: str, timeout: float = 60.0) -> None:
        """Bring a killed or cut-off node back: its link up, its slurmd started afresh, idle again."""
        if node != self.node:
            self.net.link(self.host(node).name, up=True)
        proc = self.slurmd.get(node)
        if proc is None or proc.poll() is not None:
            self.start_node(node)
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True)
        deadline = time.monotonic() + timeout
        while self.node_states().get(node) != "idle":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node} did not come back: {self.node_states()}")
            time.sleep(0.5)

    def stop(self) -> None:
        """Cancel every job and wait for it to leave, stop the daemons, then kill any job step that
        outlived them (slurmstepd daemonizes: it is nobody's child, so only its start time ties it
        to this cluster), and remove the nodes' namespaces."""
        subprocess.run(["scancel", "--full", "--user", "root"], capture_output=True)
        self.wait_no_jobs()
        self._stop_daemons()

    def _stop_daemons(self) -> None:
        """Stop the daemons this cluster started, the namespaces and what runs in them (and put
        SLURM_CONF back)."""
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for p in self.stray_steps():
            try:
                p.kill()
            except Exception:
                pass
        self.net.down()
        if self._old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = self._old_conf
