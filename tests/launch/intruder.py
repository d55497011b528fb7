"""A stranger on the mesh's network who knows a worker's address (issue #59): attaches with Monarch's own
`attach_to_workers`, as Monarch's examples do, and tries to spawn a proc there and run an actor of its own that
writes a marker file. Prints one line ``RESULT {json}``: whether it ran, and what went wrong.

    python -m tests.launch.intruder WORKER_HOST:PORT LISTEN_IP MARKER MODE [OWN_CA_DIR]

MODE: "plain" (tcp://, as against a worker before #59), "no-cert" (tls://, no certificate at all), "own-ca"
(tls://, a certificate of a CA of its own, made in OWN_CA_DIR).
"""

from __future__ import annotations

import json
import os
import sys
import time

ATTACH_S = 12.0


def main() -> None:
    worker, listen, marker, mode = sys.argv[1:5]
    for name in ("HYPERACTOR_TLS_CA", "HYPERACTOR_TLS_CERT", "HYPERACTOR_TLS_KEY"):
        os.environ.pop(name, None)
    if mode == "own-ca":
        from forge_nb.launch.credentials import Credentials

        Credentials.new(sys.argv[5]).use(listen)
    from monarch.actor import Actor, attach_to_workers, enable_transport, endpoint

    class Marker(Actor):
        @endpoint
        def write(self, path: str) -> int:
            with open(path, "w") as f:
                f.write("the intruder ran here\n")
            return os.getpid()

    scheme = "tcp" if mode == "plain" else "tls"
    out: dict = {"mode": mode, "ran": False}
    start = time.monotonic()
    try:
        enable_transport(f"{scheme}://{listen}:0")
        hosts = attach_to_workers(ca="trust_all_connections", workers=[f"{scheme}://{worker}"])
        hosts.initialized.get(timeout=ATTACH_S)
        procs = hosts.spawn_procs(per_host={"procs": 1})
        out["pid"] = procs.spawn("marker", Marker).write.call_one(marker).get(timeout=20)
        out["ran"] = True
    except BaseException as e:  # noqa: BLE001 - whatever stopped it is the result
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    out["seconds"] = round(time.monotonic() - start, 1)
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)  # Monarch's threads would keep retrying the dial


if __name__ == "__main__":
    main()
