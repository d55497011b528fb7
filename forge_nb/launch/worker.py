"""A host's Monarch worker for `mesh.kind="hosts"`:

    python -m forge_nb.launch.worker tls://ADDRESS:PORT [--credentials DIR]

ADDRESS is the one the session dials (and the worker binds): this host's address on the network the hosts share.
The worker waits for a session to attach, runs the procs that session spawns here, and when that session goes away
stops them and waits for the next one; stop the worker itself with a signal. On a host without GPUs the procs of
every role but the reward workers fork from this worker's fork server, which the first of them starts and which
ends with the worker (`forge_nb.launch.forks.on_workers`).

Only a session holding the same credentials can attach: every connection is mutual TLS (Monarch's tls:// channel)
with a certificate signed by the CA in DIR (default ~/.forge_nb/credentials; make it once with
`forge-nb credentials new`, give the same folder to the session as mesh.credentials). What you must keep secret is
DIR/ca.key: whoever can read it can run code as you on this worker. The folder must be yours and closed to others
(0700), ca.key 0600; the worker refuses it otherwise. Processes of other users on this same host can still reach
the worker's Monarch through its abstract Unix socket (a limit of Monarch 0.7.0): run workers on hosts where no one
else runs (docs/guides/security.md).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

from forge_nb.launch.credentials import DEFAULT_DIR, Credentials, CredentialsError
from forge_nb.launch.forks import on_workers as workerforks
from forge_nb.launch.hosts import HostsError, parse_host
from forge_nb.runtime.refusals import WORKER_REPORT, Refusals, StalledHandshakes, raise_open_files_limit


def serve(address: str, credentials: Credentials, dialled_at: str, port: int) -> None:
    """Run Monarch's worker loop at `address` (tls://..., or a Slurm worker's service address) for ever, holding a
    certificate of `credentials`' CA for `dialled_at` and every name of this host. Monarch reads the certificate
    from the environment at its import: it is set before."""
    credentials.use(dialled_at)
    raise_open_files_limit()
    watch(port, f"worker {dialled_at}:{port}")
    from monarch.actor import run_worker_loop_forever

    print(f"forge_nb worker at {address}: TLS, CA {credentials.fingerprint} ({credentials.folder})", flush=True)
    run_worker_loop_forever(address=address, ca="trust_all_connections")  # ca: the only value 0.7.0 takes; TLS is set


def watch(port: int, listener: str) -> None:
    """Connections to the worker's port that never finish a TLS handshake (half-open, a flood: `StalledHandshakes`;
    Monarch refuses a wrong certificate or garbage without a word): said on stderr at most once a second, and
    their totals written where the procs this worker starts read them (`refusals.WORKER_REPORT`), so that the
    session's events say so too."""
    try:
        report: Path | None = workerforks.folder() / f"w{os.getpid()}-refusals.json"
    except PermissionError:
        report = None
    counted = Refusals()

    def say(what: str) -> None:
        print(f"forge_nb worker: {what}", file=sys.stderr, flush=True)
        if report is not None:
            partial = report.with_suffix(".tmp")
            partial.unlink(missing_ok=True)
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(counted.totals(), f)
            partial.replace(report)

    counted.report = say
    if report is not None:
        os.environ[WORKER_REPORT] = str(report)  # the procs started here inherit it
    StalledHandshakes(port, listener, counted).start()


def slurm_worker(port: int, credentials: str) -> None:
    """The worker of one node of a Slurm session's job (its batch script runs this through srun): at the node's
    ``NodeAddr``, the address the session dials (a TLS address keeps its host name where a TCP one is resolved
    when bound: at the node's name, a session that cannot resolve it could not reach the procs' host), with the
    service identity Monarch gave the node (`SLURM_NODEID`), holding the job's credentials."""
    from monarch._src.job.service_identity import ranked_service_proc_id_from_env, service_proc_addr

    from forge_nb.launch.slurm import node_addresses

    found = Credentials.load(credentials)
    (address,) = node_addresses([os.environ.get("SLURMD_NODENAME") or socket.gethostname()])
    proc_id = ranked_service_proc_id_from_env(rank_env="SLURM_NODEID")
    serve(service_proc_addr(f"tls://{address}:{port}", proc_id), found, address, port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("address", help="tls://ADDRESS:PORT this worker listens on (and the session dials)")
    parser.add_argument(
        "--credentials",
        default=DEFAULT_DIR,
        metavar="DIR",
        help=f"the folder of the mesh's CA (ca.crt, and ca.key: the secret), default {DEFAULT_DIR}",
    )
    args = parser.parse_args(argv)
    try:
        host, port = parse_host(args.address)
        credentials = Credentials.load(args.credentials)
    except (HostsError, CredentialsError) as e:
        sys.exit(str(e))
    serve(f"tls://{host}:{port}", credentials, host, port)


if __name__ == "__main__":
    main()
