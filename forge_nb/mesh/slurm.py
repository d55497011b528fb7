"""Slurm mesh: the session's roles in procs on the nodes of one Slurm job, via `monarch.job.SlurmJob`.

The job runs Monarch workers (one per node, started by `srun`); the kernel attaches to them over TCP
and spawns each role's procs there, exactly as `LocalMesh` does on this host. Actors therefore see
the job's environment (``SLURM_JOB_ID``, GPUs granted by ``--gpus-per-node``).

`Slurm2205Job` bridges Monarch 0.7.0's `SlurmJob`, which reads ``squeue --json`` as Slurm >= 23.02
writes it, to Slurm 22.05 (Debian 12): there ``--job N`` does not filter the JSON, and a running job's
nodes are listed under ``job_resources.allocated_nodes[].nodename``. Newer Slurms pass through.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

from monarch.config import configure
from monarch.job import SERVICE_PROC_IDS_ENV, SlurmJob, deserialize_service_proc_ids

from forge_nb.config import SlurmConfig
from forge_nb.mesh.local import LocalMesh
from forge_nb.mesh.placement import Placement

ROLES = ("generator", "trainer", "reward")
_SHARES_NODE = {"reference": "trainer", "judge": "reward", "live_check": "reward"}  # role -> whose node it runs on
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


class Slurm2205Job(SlurmJob):
    """`SlurmJob` that reads squeue per job id and reports why a job stayed pending."""

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


def _worker_identity(job_id: str) -> tuple[int, list]:
    """(port, worker ids) a forge_nb job's workers were started with, read back from its batch script:
    a client must dial that port and address the workers by those ids."""
    out = subprocess.run(["scontrol", "write", "batch_script", job_id, "-"], capture_output=True, text=True)
    prefix = f"export {SERVICE_PROC_IDS_ENV}="
    ids = [line.removeprefix(prefix) for line in out.stdout.splitlines() if line.startswith(prefix)]
    port = re.search(r"tcp://\{socket\.gethostname\(\)\}:(\d+)", out.stdout)
    if not ids or not port:
        raise SlurmError(f"slurm.job_id={job_id}: not a job forge_nb started (no Monarch workers in its batch script)")
    return int(port.group(1)), deserialize_service_proc_ids(shlex.split(ids[0])[0])


def free_port() -> int:
    """A TCP port free on this host now (the workers' nodes are assumed alike; a clash fails the job
    at start, with the error in its log)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


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


class SlurmMesh(LocalMesh):
    """`LocalMesh` whose roles start on the nodes of a Slurm job; `stop()` also cancels the job."""

    shares_cores = False  # other hosts: their workers keep their own environment

    def __init__(self, cfg: SlurmConfig, placement: Placement | None = None) -> None:
        super().__init__(placement)
        self.cfg = cfg
        missing = [tool for tool in ("sbatch", "squeue", "scancel", "scontrol") if shutil.which(tool) is None]
        if missing:
            raise SlurmError(
                f"{', '.join(missing)} not found: mesh.kind='slurm' needs Slurm's client tools on PATH "
                "(run the kernel on a Slurm login or submit host)"
            )
        meshes = {role: 1 for role in ROLES} if cfg.separate_hosts else {"node": 1}
        self.job = Slurm2205Job(
            meshes=meshes,
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
            # SlurmJob sets the client's transport to "TCP at my hostname", which Monarch refuses when the
            # name resolves to loopback only. Then no other host could reach us anyway: the cluster is
            # this machine, so listen on loopback explicitly.
            configure(default_transport="tcp://127.0.0.1:0")
        if cfg.job_id:
            self._adopt(cfg.job_id)
        else:
            self._submit()
        self.job_id: str = self.job._slurm_job_id
        try:
            self.hosts = self.job.state(cached_path=None)
        except SlurmError:
            raise
        except Exception as e:
            self.cancel()
            raise SlurmError(
                f"could not attach to the workers of Slurm job {self.job_id}: {e}; it was cancelled"
            ) from e

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
        self.job._port, self.job._service_proc_ids = _worker_identity(job_id)
        if len(self.job._service_proc_ids) != sum(self.job._meshes.values()):
            raise SlurmError(
                f"slurm.job_id={job_id}: its workers were started for another layout "
                f"(slurm.separate_hosts must match the session that started it)"
            )
        self.job._status = "running"

    def host(self, role: str) -> Any:
        """The job's node for `role` (its own node with `separate_hosts`; a reference model shares
        the trainer's, judges ("judge", "judge-2", ...) and the live-code checker the reward procs')."""
        if not self.cfg.separate_hosts:
            return self.hosts.node
        return getattr(self.hosts, _SHARES_NODE.get(role.split("-")[0], role))

    def master_addr(self, role: str) -> str | None:
        """Where `role`'s gang meets: the name of its first proc's node, as that proc reports it."""
        return None

    def stop(self) -> list[str]:
        """Stop every proc mesh, then cancel the job (unless `keep_job`) -> errors, if any."""
        errors = super().stop()
        if not self.cfg.keep_job:
            self.cancel()
        return errors

    def cancel(self) -> None:
        """scancel the job and wait until it has left the running state."""
        job_id = self.job._slurm_job_id
        self.job.kill()
        if job_id:
            deadline = time.monotonic() + 30
            while (info := squeue_job(job_id)) and "RUNNING" in info["job_state"] and time.monotonic() < deadline:
                time.sleep(0.2)
