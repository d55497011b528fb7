"""A host's Monarch worker for `mesh.kind="hosts"`: ``python -m forge_nb.launch.worker tcp://ADDRESS:PORT``.

ADDRESS is the one the kernel dials (and the worker binds): this host's address on the network the
hosts share. The worker waits for a kernel to attach, runs the procs that kernel spawns here, and when
that kernel goes away stops them and waits for the next one; stop the worker itself with a signal. On a
host without GPUs the procs of every role but the reward workers fork from this worker's fork server,
which the first of them starts and which ends with the worker (`forge_nb.launch.forks.on_workers`).
"""

from __future__ import annotations

import argparse

from forge_nb.launch.hosts import parse_host


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("address", help="tcp://ADDRESS:PORT this worker listens on (and the kernel dials)")
    host, port = parse_host(parser.parse_args(argv).address)
    from monarch.actor import run_worker_loop_forever

    run_worker_loop_forever(address=f"tcp://{host}:{port}", ca="trust_all_connections")


if __name__ == "__main__":
    main()
