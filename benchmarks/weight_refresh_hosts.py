"""Cross-host weight refresh (`weight_refresh.py --hosts`): one trainer host, up to 4 generator hosts,
each a network namespace on one bridge (`forge_nb.testing.netns_hosts`, root only), one run, side by side:

forge_nb (tcp)       the product path across hosts: publish, pull over the trainer's TCP streams
                     (`weights.stream`, `--streams` connections, 4 as in the config; each proves the session's
                     secret before its first byte), check the version, load into the receiver's tensors
x1 copy only         forge_nb x1's copy into its staging buffer alone (what gloo's broadcast does)
forge_nb (rdma)      the same over Monarch RDMABuffers (its TCP fallback here: no ibverbs)
gloo broadcast       torch.distributed gloo over the same veth links, one tensor of the same size
link (iperf3)        the raw rate of one link, 1 and 2 TCP streams (iperf3 -R: trainer host sends)
fan-out              N generators on N hosts refreshed at once from the one trainer (N = 1, 2, 4):
                     seconds until the last has loaded, vs a gloo broadcast to N ranks

GB/s = 1e9 bytes/s of one model copy (fan-out: of the copy every generator gets, so a link-bound
trainer halves it at N = 2). forge_nb's seconds are the controller's wall time of the refresh calls and
include staging, the version check and the load; gloo's are the broadcast alone.

Measured at 2ee9a85 (2 shared cores, 5 hosts, `--sizes-mb 16 256 1024 --fanout 1 2 4`, 2 streams, a loaded
machine): forge_nb x1 1.70 / 1.53 GB/s vs gloo 1.53 / 1.81 at 256 MB / 1 GB (1.11x / 0.85x).
On the idle machine, one run each (`--reps 5`): with 2 streams 1.23x / 0.99x; with 4 streams 1.07x / 1.09x, then
again (the default since; `--sizes-mb 16 256 1024 --reps 5`):
raw link: iperf3 x1 2.38 GB/s, x2 3.50 GB/s

    size  forge_nb (rdma)  forge_nb x1  x1 copy only  forge_nb x2  forge_nb x4  gloo x1  gloo x2  gloo x4  tcp/gloo x1
    16MB            0.395        1.361         1.759        1.192        0.616    2.175    1.111    0.828        0.63x
   256MB            1.158        3.185         3.916        1.704        0.855    2.960    1.434    0.852        1.08x
  1024MB            0.859        3.416         4.179        1.722        0.870    2.931    1.405    0.723        1.17x

At 16 MB a refresh's fixed costs (the actor call, the version check, one chunk) dominate.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORT = 26610


def _env() -> dict[str, str]:
    # Procs on the hosts import forge_nb and this benchmark's actors (module weight_refresh).
    return {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'benchmarks'}", "GLOO_SOCKET_IFNAME": "eth0"}


def link_rate(net, streams: int) -> float:
    """iperf3 from the trainer host to the first generator host -> GB/s (nan without iperf3: apt-get
    install iperf3)."""
    if shutil.which("iperf3") is None:
        return float("nan")
    server, client = net.hosts[0], net.hosts[1]
    srv = subprocess.Popen([*server.exec_args(), "iperf3", "-s", "-1", "-p", "5301"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        cmd = ["iperf3", "-c", server.ip, "-p", "5301", "-R", "-t", "3", "-P", str(streams), "-J"]
        out = subprocess.run([*client.exec_args(), *cmd], capture_output=True, text=True, timeout=30)
        return json.loads(out.stdout)["end"]["sum_received"]["bits_per_second"] / 8e9
    finally:
        srv.kill()
        srv.wait()


def gloo_seconds(net, size_bytes: int, ranks: int, reps: int) -> float:
    """Median seconds of a gloo broadcast from host 0 to hosts 1..ranks-1 (the slowest receiver)."""
    master = net.hosts[0].ip
    procs = [
        subprocess.Popen(
            [*net.hosts[r].exec_args(), sys.executable, __file__, "gloo", str(r), str(ranks), master]
            + [str(size_bytes), str(reps)],
            stdout=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for r in range(ranks)
    ]
    outs = [p.communicate(timeout=900)[0] for p in procs]
    return max(float(o.strip().splitlines()[-1]) for o in outs[1:])


def _gloo_rank(rank: int, world: int, master: str, size_bytes: int, reps: int) -> None:
    from weight_refresh import gloo_broadcast_seconds

    os.environ.update(MASTER_ADDR=master, MASTER_PORT=str(PORT + 1))
    print(gloo_broadcast_seconds(rank, world, size_bytes, reps), flush=True)


def mesh_seconds(
    hosts, trainer_host: str, size_bytes: int, fanout: list[int], reps: int, streams: int
) -> dict[str, float]:
    """forge_nb's refresh across hosts: tcp and rdma to one generator, tcp to N at once; for tcp to one, also
    the copy alone (before the version check and the load, as gloo's broadcast has neither)."""
    from weight_refresh import Publisher, Receiver

    from forge_nb.runtime.calls import wait

    n = max(fanout)
    pub_procs = hosts.slice(hosts=0).spawn_procs(per_host={"procs": 1}, name="publisher")
    rec_procs = [hosts.slice(hosts=i).spawn_procs(per_host={"procs": 1}, name=f"receiver{i}") for i in range(1, n + 1)]
    try:
        secret = secrets.token_bytes(32)  # as a session's: to the publisher in its spec, to readers in the manifest
        publisher = pub_procs.spawn("publisher", Publisher, size_bytes, secret, trainer_host)
        receivers = [p.spawn("receiver", Receiver, size_bytes) for p in rec_procs]
        manifest = wait(publisher.manifest.call_one())
        stream = dataclasses.replace(manifest.stream, streams=streams, secret=secret)
        manifest = dataclasses.replace(manifest, stream=stream)
        out: dict[str, float] = {}
        transports = {"tcp": receivers, "rdma": receivers[:1]}
        for transport, attached in transports.items():
            for r in attached:
                assert wait(r.attach.call_one(manifest, transport)) == transport
        for label, transport, group in [("forge_nb (rdma)", "rdma", 1)] + [
            (f"forge_nb x{k}", "tcp", k) for k in fanout
        ]:
            times, copies = [], []
            for _ in range(reps + 1):  # the first refresh warms up
                version = wait(publisher.step.call_one())
                start = time.perf_counter()
                for f in [r.refresh.call_one(transport, version) for r in receivers[:group]]:
                    wait(f)
                times.append(time.perf_counter() - start)
                copies.append(wait(receivers[0].last_transfer_seconds.call_one()))
            out[label] = statistics.median(times[1:])
            if label == "forge_nb x1":
                out["x1 copy only"] = statistics.median(copies[1:])
        return out
    finally:
        wait(pub_procs.stop())
        for p in rec_procs:
            wait(p.stop())


def run(sizes_mb: list[int], fanout: list[int], reps: int = 0, streams: int = 4) -> None:
    import tempfile

    from monarch.actor import attach_to_workers, enable_transport

    from forge_nb.launch.credentials import Credentials
    from forge_nb.testing.netns_hosts import HostNet

    net = HostNet(1 + max(fanout), "bench").up()
    folder = tempfile.mkdtemp()
    credentials = Credentials.new(os.path.join(folder, "credentials"))
    workers = [
        subprocess.Popen(h.worker_args(PORT, str(credentials.folder)), env=_env(), stdout=subprocess.DEVNULL)
        for h in net.hosts
    ]
    try:
        links = {f"link x{s} (iperf3)": link_rate(net, s) for s in (1, 2)}
        credentials.use(net.gateway)
        enable_transport(f"tls://{net.gateway}:0")
        hosts = attach_to_workers(ca="trust_all_connections", workers=[f"tls://{h.ip}:{PORT}" for h in net.hosts])
        rows = []
        for mb in sizes_mb:
            size = mb << 20
            n = reps or (5 if mb <= 64 else 3 if mb <= 256 else 2)
            seconds = mesh_seconds(hosts, net.hosts[0].ip, size, fanout, n, streams)
            for k in fanout:
                seconds[f"gloo x{k}"] = gloo_seconds(net, size, k + 1, n)
            rows.append((mb, {m: size / s / 1e9 for m, s in seconds.items()}))
            print(f"measured {mb} MB", flush=True)
    finally:
        for w in workers:
            w.kill()
            w.wait()
        net.down()
        shutil.rmtree(folder, ignore_errors=True)
    print(
        f"\ncross-host weight refresh GB/s (median), {len(net.hosts)} namespace hosts on one bridge, "
        f"{os.cpu_count()} cores, {streams} TCP streams per generator; xN = N generator hosts at once (GB/s of the "
        "copy each gets); x1 copy only = forge_nb x1's copy into staging, without the version check and the load"
    )
    print("raw link: " + ", ".join(f"{k} {v:.2f} GB/s" for k, v in links.items()) + "\n")
    methods = list(rows[0][1])
    print(f"{'size':>8}" + "".join(f"{m:>17}" for m in methods) + f"{'tcp/gloo x1':>13}{'copy/gloo x1':>14}")
    for mb, gbps in rows:
        ratio, copy = (gbps[m] / gbps["gloo x1"] for m in ("forge_nb x1", "x1 copy only"))
        print(f"{mb:>6}MB" + "".join(f"{gbps[m]:>17.3f}" for m in methods) + f"{ratio:>12.2f}x{copy:>13.2f}x")
    print("\ngoal: forge_nb (tcp) >= 1.0x gloo at 256 MB and 1 GB")


if __name__ == "__main__":
    if sys.argv[1:2] == ["gloo"]:
        r, w, m, s, n = sys.argv[2:7]
        _gloo_rank(int(r), int(w), m, int(s), int(n))
