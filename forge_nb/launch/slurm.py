"""Slurm mesh: the session's roles in procs on the `slurm.nodes` nodes of one Slurm job, via
`monarch.job.SlurmJob`.

The job runs forge_nb's workers (one per node, started by `srun`: `launch.worker.slurm_worker`, in place of
Monarch's own, which listens on tcp:// and takes anyone's procs); the kernel attaches to them over mutual TLS at
each node's ``NodeAddr`` and spawns each role's procs on the nodes the placement plan gives
(`launch.placement.shape`: the trainer's gang over the first `mesh.trainer_hosts` nodes, generator
replicas on the next, the reward procs on the last), exactly as `HostsMesh` does on its hosts. Actors
therefore see the job's environment (``SLURM_JOB_ID``, GPUs granted by ``--gpus-per-node``).

Each job gets a CA of its own (`launch.credentials`), made before it is submitted in a folder of the job's log
folder (``slurm.log_dir``, which every node must see: the batch script names it), readable by the user only;
each node's worker and the kernel sign their own certificates with it. It goes when the job is cancelled (a
`keep_job` job keeps it, for the session that attaches next).

`Slurm2205Job` bridges Monarch 0.7.0's `SlurmJob`, which reads ``squeue --json`` as Slurm >= 23.02
writes it, to Slurm 22.05 (Debian 12): there ``--job N`` does not filter the JSON, and a running job's
nodes are listed under ``job_resources.allocated_nodes[].nodename``. Newer Slurms pass through.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

from monarch._src.job import slurm as monarch_slurm
from monarch.actor import attach_to_workers, enable_transport
from monarch.config import configure
from monarch.job import SERVICE_PROC_IDS_ENV, SlurmJob, deserialize_service_proc_ids, service_proc_addrs

from forge_nb.config import SlurmConfig
from forge_nb.launch.credentials import Credentials, CredentialsError
from forge_nb.launch.hosts import ATTACH_TIMEOUT_S, PlacedMesh, listening_ports, route_source
from forge_nb.launch.placement import Placement
from forge_nb.runtime.calls import wait

_TERMINAL = ("FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "COMPLETED", "NODE_FAIL", "OUT_OF_MEMORY")


class SlurmError(RuntimeError):
    """The Slurm job could not be submitted, did not start in time, or ended; the message says why
    and whether the job was cancelled."""


def squeue_job(job_id: str) -> dict[str, Any] | None:
    """The queue entry of job `job_id` in the >= 23.02 layout (None once it has left the queue)."""
    out = subprocess.run(["squeue", "--json", "--job", job_id], capture_output=True, text=True)
    if out.returncode != 0:
        if "Invalid job id" in out.stderr:
            return None
        raise SlurmError(f"squeue failed for job {job_id}: {out.stderr.strip()}")
    jobs = [j for j in json.loads(out.stdout).get("jobs", []) if str(j.get("job_id")) == str(job_id)]
    return _normalise(jobs[0]) if jobs else None


def _normalise(job: dict[str, Any]) -> dict[str, Any]:
    """Slurm 22.05 -> 23.02 layout: state as a list, nodes as ``{"allocation": [{"name": ...}]}``."""
    job = dict(job)
    if isinstance(job.get("job_state"), str):
        job["job_state"] = [job["job_state"]]
    resources = dict(job.get("job_resources") or {})
    if not isinstance(resources.get("nodes"), dict):
        names = [n["nodename"] for n in resources.get("allocated_nodes", []) if "nodename" in n]
        resources["nodes"] = {"allocation": [{"name": n} for n in names]}
    job["job_resources"] = resources
    return job


def worker_bootstrap(port: int, credentials: str) -> str:
    """The Python each node's srun runs (``python -c '...'`` in the batch script): forge_nb's worker at this node's
    host name and `port`, holding the CA at `credentials`."""
    if "'" in credentials:
        raise SlurmError(f"slurm.log_dir {credentials!r}: a path with a single quote cannot go in the batch script")
    return f"from forge_nb.launch.worker import slurm_worker; slurm_worker({port}, {json.dumps(credentials)})"


class Slurm2205Job(SlurmJob):
    """`SlurmJob` that reads squeue per job id, reports why a job stayed pending, and runs forge_nb's worker on
    each node, holding the job's `credentials` (a folder)."""

    credentials = ""

    def _submit_slurm_job(self, num_nodes: int, client_script: str | None = None) -> str:
        """Monarch's batch script with forge_nb's worker in place of Monarch's (`worker_bootstrap`): Monarch
        writes its worker's line from its module's `_worker_bootstrap`, replaced for the submission."""
        monarch_own = monarch_slurm._worker_bootstrap
        monarch_slurm._worker_bootstrap = lambda port, bind_to: worker_bootstrap(port, self.credentials)
        try:
            return super()._submit_slurm_job(num_nodes, client_script)
        finally:
            monarch_slurm._worker_bootstrap = monarch_own

    def _get_job_info_json(self, job_id: str) -> dict[str, Any] | None:
        return squeue_job(job_id)

    def _wait_for_job_start(self, job_id: str, expected_nodes: int, timeout: int | None = None) -> list[str]:
        """Poll until the job runs -> its node names. Pending past `timeout` or ended: cancel, raise."""
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        info: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            info = squeue_job(job_id)
            state = info["job_state"] if info else ["GONE"]
            if "RUNNING" in state:
                names = [n["name"] for n in info["job_resources"]["nodes"]["allocation"]]
                if len(names) == expected_nodes:
                    return names
            elif info is None or any(s in _TERMINAL for s in state):
                self._kill()
                raise SlurmError(
                    f"Slurm job {job_id} ended before its workers started (state {state}); "
                    f"see the logs in {self._log_dir}"
                )
            time.sleep(0.5)
        reason = (info or {}).get("state_reason", "unknown")
        self._kill()
        raise SlurmError(
            f"Slurm job {job_id} was still pending after {timeout} s (reason: {reason}); it was "
            "cancelled. Raise slurm.start_timeout_s or ask for fewer resources."
        )


def _worker_identity(job_id: str) -> tuple[int, list, str]:
    """(port, worker ids, credentials folder) a forge_nb job's workers were started with, read back from its batch
    script: a client must dial that port, address the workers by those ids and hold those credentials."""
    out = subprocess.run(["scontrol", "write", "batch_script", job_id, "-"], capture_output=True, text=True)
    prefix = f"export {SERVICE_PROC_IDS_ENV}="
    ids = [line.removeprefix(prefix) for line in out.stdout.splitlines() if line.startswith(prefix)]
    worker = re.search(r"slurm_worker\((\d+), (\"[^\n]*?\")\)", out.stdout)
    if not ids or not worker:
        raise SlurmError(f"slurm.job_id={job_id}: not a job forge_nb started (no forge_nb workers in its batch script)")
    return int(worker.group(1)), deserialize_service_proc_ids(shlex.split(ids[0])[0]), json.loads(worker.group(2))


def free_port() -> int:
    """A TCP port free on this host now (the workers' nodes are assumed alike; a clash fails the job
    at start, with the error in its log)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def on_this_machine(address: str) -> bool:
    """Whether `address` is one of this machine's own (in this network namespace): a node there shares
    the kernel's network, Unix sockets included."""
    try:
        with socket.socket() as sock:
            sock.bind((address, 0))
        return True
    except OSError:
        return False


def hostname_is_routable() -> bool:
    """Whether this host's name resolves to an address other hosts could dial (not loopback)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None)
    except OSError:
        return False
    return any(not ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def partitions() -> list[str]:
    out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True)
    return [p.rstrip("*") for p in out.stdout.split()]


def node_addresses(names: list[str]) -> list[str]:
    """Each node's ``NodeAddr`` (what slurmctld itself dials; the name when Slurm has no other)."""
    out = subprocess.run(["scontrol", "show", "node", "-o", ",".join(names)], capture_output=True, text=True)
    found = dict(re.findall(r"NodeName=(\S+).*?NodeAddr=(\S+)", out.stdout))
    return [found.get(name, name) for name in names]


class SlurmMesh(PlacedMesh):
    """`PlacedMesh` on the `slurm.nodes` nodes of a Slurm job; `stop()` also cancels the job."""

    def __init__(self, cfg: SlurmConfig, placement: Placement | None = None, nodes: int = 1) -> None:
        super().__init__(placement)
        self.cfg, self.nodes = cfg, nodes
        missing = [tool for tool in ("sbatch", "squeue", "scancel", "scontrol") if shutil.which(tool) is None]
        if missing:
            raise SlurmError(
                f"{', '.join(missing)} not found: mesh.kind='slurm' needs Slurm's client tools on PATH "
                "(run the kernel on a Slurm login or submit host)"
            )
        self.job = Slurm2205Job(
            meshes={"node": nodes},
            python_exe=sys.executable,
            slurm_args=list(cfg.sbatch_args),
            monarch_port=cfg.port or free_port(),
            job_name="forge_nb",
            time_limit=cfg.time_limit or None,
            partition=cfg.partition or None,
            log_dir=os.path.abspath(cfg.log_dir),
            exclusive=cfg.exclusive,
            gpus_per_node=cfg.gpus_per_node or None,
            job_start_timeout=int(cfg.start_timeout_s),
            account=cfg.account or None,
            qos=cfg.qos or None,
        )
        if not hostname_is_routable():
            # SlurmJob just made "TCP at my host name" this process's default transport, which Monarch refuses
            # (a panic in the next proc spawned, even of a later local session) when the name resolves to
            # loopback only. `_listen` picks the address the nodes reach; until then, and for a kernel whose
            # transport is already fixed, loopback.
            configure(default_transport="tcp://127.0.0.1:0")
        if cfg.job_id:
            self._adopt(cfg.job_id)
        else:
            # The job's own CA, in a folder of its log folder that every node sees (the batch script names it).
            folder = os.path.join(os.path.abspath(cfg.log_dir), f"credentials-{secrets.token_hex(6)}")
            self.job.credentials = str(Credentials.new(folder).folder)
            try:
                self._submit()
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
        self.job_id: str = self.job._slurm_job_id
        try:
            self._attach()
        except SlurmError:
            if not cfg.job_id:  # the job this session submitted was cancelled: its credentials go too
                shutil.rmtree(self.job.credentials, ignore_errors=True)
            raise
        except Exception as e:
            self.cancel()
            raise SlurmError(
                f"could not attach to the workers of Slurm job {self.job_id}: {e}; it was cancelled"
            ) from e

    def _attach(self) -> None:
        """Wait for the job's nodes, then attach to the worker on each at its ``NodeAddr``: the name of a
        node need not resolve here (a login host's DNS may not know it), the address Slurm dials does."""
        job = self.job
        names = job._all_hostnames or job._wait_for_job_start(self.job_id, self.nodes, job._job_start_timeout)
        job._all_hostnames = names
        self.names, self.addresses = list(names), node_addresses(names)
        self.ports = [job._port] * len(names)
        listen, before = self._listen()
        workers = service_proc_addrs([f"tls://{a}:{job._port}" for a in self.addresses], job._service_proc_ids)
        self.hosts = attach_to_workers(name="node", ca="trust_all_connections", workers=workers)
        try:
            wait(self.hosts.initialized, ATTACH_TIMEOUT_S)
        except Exception as e:
            self.cancel()
            raise SlurmError(
                f"could not attach to the workers of Slurm job {self.job_id} on {', '.join(names)} in "
                f"{ATTACH_TIMEOUT_S:.0f} s ({type(e).__name__}: {e}); it was cancelled. The workers' log is in "
                f"{self.cfg.log_dir}"
            ) from None
        self.attached(listen, before)

    def _submit(self) -> None:
        try:
            self.job.apply()
        except RuntimeError as e:
            known = partitions()
            hint = f" (slurm.partition={self.cfg.partition!r}; partitions here: {', '.join(known)})" if known else ""
            said = str(e).removeprefix("Failed to submit SLURM job:").replace("sbatch: error:", "").split("\n")
            said = "; ".join(line.strip() for line in said if line.strip())
            raise SlurmError(f"sbatch refused the forge_nb job: {said}{hint}") from None

    def _adopt(self, job_id: str) -> None:
        """Attach to a running job whose workers forge_nb started (`keep_job`): Monarch's SlurmJob has
        no public way to adopt a job id, so set what `apply()` would have set."""
        info = squeue_job(job_id)
        if info is None or "RUNNING" not in info["job_state"]:
            state = info["job_state"] if info else "not in the queue"
            raise SlurmError(f"slurm.job_id={job_id}: cannot attach, the job is {state}")
        self.job._slurm_job_id = job_id
        self.job._port, self.job._service_proc_ids, self.job.credentials = _worker_identity(job_id)
        if len(self.job._service_proc_ids) != self.nodes:
            raise SlurmError(
                f"slurm.job_id={job_id}: its workers run on {len(self.job._service_proc_ids)} node(s), this "
                f"session asks for slurm.nodes={self.nodes}; they must match the session that started it"
            )
        self.job._all_hostnames = [n["name"] for n in info["job_resources"]["nodes"]["allocation"]]
        self.job._status = "running"

    def node_states(self) -> dict[str, str]:
        """Slurm's state of each node of the job ("mixed", "down*": the ``*`` says it does not respond)."""
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-n", ",".join(self.names), "-o", "%N %T"], capture_output=True, text=True
        )
        pairs = [line.split() for line in out.stdout.splitlines()] if out.returncode == 0 else []
        return {p[0]: p[1] for p in pairs if len(p) == 2}

    def failed_first(self, lost: list[int]) -> list[int]:
        """The lost nodes Slurm finds not responding or down: one node's loss ends the job step that runs
        every node's worker (srun), so the others stop answering too. None flagged yet: all of them."""
        states = self.node_states()
        flagged = [
            h for h in lost if states.get(self.names[h], "").endswith("*") or "down" in states.get(self.names[h], "")
        ]
        return flagged or lost

    def _listen(self) -> tuple[str, set[int]]:
        """Make this kernel's Monarch listen on TLS where the nodes reach it, holding a certificate of the job's
        CA: at its host name when that resolves to an address others can dial, else where the route to the
        first node leaves this host -> (that address, the ports this process listened on there before).
        Monarch fixes a process's transport at its first use: a kernel that ran a local session first
        listens on Unix sockets, which only a node on this machine's own network reaches."""
        name = socket.gethostname() if hostname_is_routable() else route_source(self.addresses[0], self.job._port)
        try:
            Credentials.load(self.job.credentials).use(name)
        except CredentialsError as e:
            self.cancel()
            raise SlurmError(f"{e}; job {self.job_id} was cancelled") from None
        listen = socket.gethostbyname(name)
        before = listening_ports(listen)
        try:
            enable_transport(f"tls://{name}:0")
        except RuntimeError:
            elsewhere = [n for n, a in zip(self.names, self.addresses) if not on_this_machine(a)]
            if elsewhere:
                self.cancel()
                raise SlurmError(
                    f"the job's node(s) {', '.join(elsewhere)} cannot reach this kernel: Monarch already runs here "
                    "over Unix sockets (a local session ran in this kernel first), and a process's transport is "
                    "fixed at its first use. Restart the kernel and start the Slurm session before any local one "
                    "(forge_nb.up() runs each session in a server process of its own, where this cannot happen); "
                    f"job {self.job_id} was cancelled"
                ) from None
        return listen, before

    def describe_host(self, host: int) -> str:
        """The node, what Slurm says of it, and that its worker does not answer."""
        state = self.node_states().get(self.names[host], "unknown")
        address = f"{self.addresses[host]}:{self.ports[host]}"
        return f"node {self.names[host]} (Slurm's state: {state}; its worker at {address} does not answer)"

    @property
    def cancels_job(self) -> bool:
        return not self.cfg.keep_job

    def stop(self, timeout: float | None = None) -> list[str]:
        """Stop every proc mesh, then cancel the job (unless `keep_job`) -> errors, if any."""
        errors = super().stop(timeout)
        if not self.cfg.keep_job:
            self.cancel()
        return errors

    def cancel(self) -> None:
        """scancel the job, wait until it has left the running state, and remove its credentials."""
        job_id = self.job._slurm_job_id
        self.job.kill()
        if job_id:
            deadline = time.monotonic() + 30
            while (info := squeue_job(job_id)) and "RUNNING" in info["job_state"] and time.monotonic() < deadline:
                time.sleep(0.2)
        if self.job.credentials:
            shutil.rmtree(self.job.credentials, ignore_errors=True)
