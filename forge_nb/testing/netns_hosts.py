"""Several hosts on one machine: Linux network namespaces joined by a bridge (root only).

Each host is a network namespace ``fnb-<tag>-h<i>`` with its own interface ``eth0`` at
``10.<a>.<b>.1<i>/24``; a veth pair joins it to the bridge ``fnb-<tag>-br`` in the root namespace,
which holds ``10.<a>.<b>.1`` (where a controller in the root namespace listens). Traffic between
hosts crosses two veth links and the bridge and never leaves the machine. A host's link can be
taken down (`link`) or slowed (`slow`: tbf rate, netem delay) to test failures.

Every name starts with ``fnb-`` (``fnb`` for interfaces, whose names are limited to 15 bytes), so
`down` finds leftovers of any earlier run; `down` is idempotent and kills every process still
running inside the namespaces first.

    python -m forge_nb.testing.netns_hosts up --hosts 3 --tag t0 [--workers 26600 [--credentials DIR]]
        # prints the hosts, one a line; --workers: a forge_nb worker on each (holding the CA in DIR, made
        # there when missing; default ~/.forge_nb/credentials), and the --hosts to use
    python -m forge_nb.testing.netns_hosts status
    python -m forge_nb.testing.netns_hosts down [--tag t0]          # every fnb- namespace without --tag
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

PREFIX = "fnb-"


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no `ip`, or the kernel refused); says which."""


@dataclass(frozen=True)
class Host:
    """One namespace host: its name, namespace, address and the root side of its veth pair."""

    name: str
    netns: str
    ip: str
    veth: str  # root-namespace end, on the bridge

    def exec_args(self) -> list[str]:
        """Prefix that runs a command inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns]

    def worker_args(self, port: int, credentials: str, python: str = sys.executable) -> list[str]:
        """The forge_nb worker of this host at tls://ip:port holding the CA in `credentials`, with a
        /dev/shm of its own (`ip netns exec` gives the command a mount namespace; a fresh tmpfs there
        makes this host's shared memory its own, as on a separate machine, so weights cross the link)."""
        own_shm = 'mount -t tmpfs tmpfs /dev/shm && exec "$@"'
        worker = [python, "-m", "forge_nb.launch.worker", f"tls://{self.ip}:{port}", "--credentials", credentials]
        return [*self.exec_args(), "sh", "-c", own_shm, "sh", *worker]


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(list(args), capture_output=True, text=True)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {out.stderr.strip()}")
    return out


def subnet(tag: str) -> str:
    """A /24 per tag (10.200-249.x.0), so two sets of hosts made at once never share addresses."""
    h = int(hashlib.sha1(tag.encode()).hexdigest(), 16)
    return f"10.{200 + h % 50}.{(h >> 8) % 256}"


def bridge_name(tag: str) -> str:
    return f"fnb{tag}br"[:15]


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or None when they can (tried: one made and removed)."""
    if shutil.which("ip") is None:
        return "the `ip` tool (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    probe = f"{PREFIX}probe-{os.getpid()}"
    made = _run("ip", "netns", "add", probe, check=False)
    _run("ip", "netns", "del", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    return None


class HostNet:
    """`n` namespace hosts on one bridge; `down()` removes every trace (also after a failure)."""

    def __init__(self, n: int = 3, tag: str = "0") -> None:
        if not 1 <= n <= 9:
            raise ValueError(f"1 to 9 hosts, got {n}")
        if len(tag) > 6 or not tag.isalnum():
            raise ValueError(f"tag must be 1-6 letters or digits (interface names are 15 bytes), got {tag!r}")
        self.tag, self.net = tag, subnet(tag)
        self.bridge = bridge_name(tag)
        self.gateway = f"{self.net}.1"
        self.hosts = [
            Host(f"h{i}", f"{PREFIX}{tag}-h{i}", f"{self.net}.{10 + i}", f"fnb{tag}h{i}") for i in range(1, n + 1)
        ]

    def up(self) -> HostNet:
        """Make the bridge and the namespaces; on any failure remove what was made, then raise."""
        reason = unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        self.down()  # leftovers of a run with this tag that was killed
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            for h in self.hosts:
                _run("ip", "netns", "add", h.netns)
                _run("ip", "link", "add", h.veth, "type", "veth", "peer", "name", f"{h.veth}p")
                _run("ip", "link", "set", f"{h.veth}p", "netns", h.netns)
                _run("ip", "link", "set", h.veth, "master", self.bridge)
                _run("ip", "link", "set", h.veth, "up")
                inside = h.exec_args()
                _run(*inside, "ip", "link", "set", f"{h.veth}p", "name", "eth0")
                _run(*inside, "ip", "addr", "add", f"{h.ip}/24", "dev", "eth0")
                _run(*inside, "ip", "link", "set", "eth0", "up")
                _run(*inside, "ip", "link", "set", "lo", "up")
                _run(*inside, "ip", "route", "add", "default", "via", self.gateway)
        except BaseException:
            self.down()
            raise
        return self

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def link(self, name: str, up: bool) -> None:
        """Take host `name`'s link down or bring it back (the root end: the host sees carrier loss)."""
        _run("ip", "link", "set", self.host(name).veth, "up" if up else "down")

    def slow(self, name: str, rate_mbit: float = 0.0, delay_ms: float = 0.0) -> None:
        """Cap the rate of (tbf) or delay (netem) traffic leaving host `name`; both 0 removes it.
        Some kernels lack netem (this one: "Specified qdisc kind is unknown"); tbf is everywhere."""
        inside = self.host(name).exec_args()
        _run(*inside, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        if delay_ms:
            rate = ["rate", f"{rate_mbit}mbit"] if rate_mbit else []
            _run(*inside, "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", f"{delay_ms}ms", *rate)
        elif rate_mbit:
            shape = ["rate", f"{rate_mbit}mbit", "burst", "64kb", "latency", "10s"]
            _run(*inside, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", *shape)

    def down(self) -> None:
        down(self.tag)

    def __enter__(self) -> HostNet:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


def namespaces(tag: str | None = None) -> list[str]:
    """This machine's fnb- namespaces (those of `tag` only, when given)."""
    out = _run("ip", "netns", "list", check=False).stdout.split("\n")
    names = [line.split()[0] for line in out if line.strip()]
    want = f"{PREFIX}{tag}-" if tag else PREFIX
    return [n for n in names if n.startswith(want)]


def pids_inside(netns: str) -> list[int]:
    """Processes running in `netns`."""
    return [int(p) for p in _run("ip", "netns", "pids", netns, check=False).stdout.split()]


def kill_inside(netns: str, timeout: float = 5.0) -> None:
    """SIGKILL every process running in `netns` and wait until they are gone."""
    deadline = time.monotonic() + timeout
    while pids := pids_inside(netns):
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in {netns} survived SIGKILL")
        time.sleep(0.05)


def down(tag: str | None = None) -> None:
    """Remove the namespaces, veths and bridge of `tag` (of every tag when None); idempotent."""
    for ns in namespaces(tag):
        kill_inside(ns)
        _run("ip", "netns", "del", ns, check=False)  # its veth end goes with it, and so the pair
    links = _run("ip", "-o", "link", "show", check=False).stdout.split("\n")
    names = [line.split(":")[1].strip().split("@")[0] for line in links if line.count(":") >= 2]
    for name in names:
        ours = name.startswith((f"fnb{tag}h", bridge_name(tag))) if tag else name.startswith("fnb")
        if ours:
            _run("ip", "link", "del", name, check=False)


def _credentials(folder: str | None) -> str:
    """The credentials folder for the workers: `folder` (default ~/.forge_nb/credentials), made when missing."""
    from forge_nb.launch.credentials import CA_KEY, DEFAULT_DIR, Credentials

    path = os.path.expanduser(folder or DEFAULT_DIR)
    if not os.path.exists(os.path.join(path, CA_KEY)):
        Credentials.new(path)
        print(f"made credentials in {path}")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--tag", default=None, help="names this set of hosts (default 0 for up, every set for down)")
    parser.add_argument("--workers", type=int, default=0, metavar="PORT", help="up: start a forge_nb worker on each")
    parser.add_argument("--credentials", default=None, metavar="DIR", help="up --workers: the CA the workers hold")
    args = parser.parse_args()
    if args.command == "up":
        net = HostNet(args.hosts, args.tag or "0").up()
        print(f"bridge {net.bridge} {net.gateway}")
        credentials = _credentials(args.credentials) if args.workers else ""
        for h in net.hosts:
            print(f"{h.name} {h.netns} {h.ip}")
            if args.workers:  # detached: they run until `down` kills what runs in the namespaces
                log = open(f"/tmp/{h.netns}-worker.log", "wb")
                argv = h.worker_args(args.workers, credentials)
                subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        if args.workers:
            print("--hosts " + ",".join(f"tls://{h.ip}:{args.workers}" for h in net.hosts))
            print(f"--credentials {credentials}")
    elif args.command == "down":
        down(args.tag)
    else:
        print("\n".join(namespaces(args.tag)) or "no fnb- namespaces")


if __name__ == "__main__":
    main()
