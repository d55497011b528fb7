"""Hosts mesh: the session's roles in procs on hosts a user already has (`mesh.kind="hosts"`).

Each host runs a Monarch worker (``python -m forge_nb.launch.worker tls://ADDRESS:PORT``, started over
ssh, by a scheduler, or in a network namespace by `forge_nb.testing.netns_hosts`), and `mesh.hosts`
lists their addresses. The kernel attaches to them (`monarch.actor.attach_to_workers`, as Monarch's
own SSH and process jobs do) over mutual TLS, with a certificate of the CA in `mesh.credentials` that the
workers hold too (`launch.credentials`), and spawns each role's procs there, exactly as `LocalMesh` does on this
host, on the hosts the placement plan gives (`launch.placement.shape`: the trainer and a reference model
on the first `mesh.trainer_hosts` hosts; generator replicas on the next; reward procs, judges and the
live-code checker on the last host; with one host every role runs on it). `PlacedMesh` is that part,
shared with the Slurm mesh, and the check that a host is gone (`HostLost`) before procs are started
there again.

The workers dial the kernel back, so the kernel must listen (TLS too) at an address they reach: the one
its routing table picks towards the first host. Monarch fixes a process's transport at its first
call, so a hosts session must be the first Monarch use of its controller's process (`HostsError`
otherwise): a session's server is a process of its own, so through `forge_nb.up` this always holds.
"""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

from monarch.actor import attach_to_workers, enable_transport

from forge_nb.launch.credentials import Credentials, CredentialsError
from forge_nb.launch.forks import on_workers as workerforks
from forge_nb.launch.forks.server import forks_wanted
from forge_nb.launch.local import STOP_TIMEOUT_S, LocalMesh
from forge_nb.launch.placement import Placement
from forge_nb.runtime import calls
from forge_nb.runtime.calls import wait
from forge_nb.runtime.refusals import REFUSED, StalledHandshakes

ATTACH_TIMEOUT_S = 60.0


class HostsError(RuntimeError):
    """The hosts in `mesh.hosts` could not be used; the message says which and why."""


def parse_host(address: str) -> tuple[str, int]:
    """ "tls://10.0.0.2:26600" or "10.0.0.2:26600" -> ("10.0.0.2", 26600). A worker speaks TLS only: "tcp://"
    is refused, saying so."""
    url = urlparse(address if "://" in address else f"tls://{address}")
    if url.scheme == "tcp":
        raise HostsError(
            f"mesh.hosts entry {address!r}: forge_nb workers listen on tls:// only (anyone who reaches a tcp:// "
            f"worker can run code on it); start it as `python -m forge_nb.launch.worker tls://HOST:PORT` and list "
            "tls://HOST:PORT (docs/guides/security.md)"
        )
    if url.scheme != "tls" or not url.hostname or not url.port:
        raise HostsError(f"mesh.hosts entry {address!r}: expected tls://HOST:PORT of a running forge_nb worker")
    return url.hostname, url.port


def route_source(host: str, port: int) -> str:
    """This machine's address on the route to `host` (no packet is sent: a UDP connect only routes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((socket.gethostbyname(host), port))
        except OSError as e:
            raise HostsError(f"no route to mesh host {host}: {e}") from None
        return probe.getsockname()[0]


class HostLost(RuntimeError):
    """A host (a Slurm node) of the mesh stopped answering with procs of the session on it; the message
    names it, the roles it held, any other host that went with it, and what still holds the policy."""


PROBE_TIMEOUT_S = 3.0
#: A host whose worker has not answered for this long, while a call waits, is lost (`PlacedMesh.watch`): a link
#: that comes back sooner (a brief outage the refresh retries through) is not. Monarch's own report of procs on
#: a host that died took ~60 s here.
HOST_LOST_AFTER_S = 15.0
PROBE_EVERY_S = 5.0


def listening_ports(address: str) -> set[int]:
    """The TCP ports this process listens on at `address`."""
    import psutil

    found = psutil.Process().net_connections("tcp")
    return {c.laddr.port for c in found if c.status == psutil.CONN_LISTEN and c.laddr.ip == address}


def answers(address: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a host's worker still takes TCP connections at address:port."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


#: Roles whose procs import no torch (the reward workers: 0.16 s to import their actor, against ~3 s for torch and
#: transformers, which an env proc's actor imports) and start as fresh interpreters on a host's worker.
LIGHT_ROLES = ("reward",)


class PlacedMesh(LocalMesh):
    """`LocalMesh` over several hosts (`hosts`, one Monarch host mesh): each role's procs start on the
    hosts the placement plan gives it. `names` label the hosts, `addresses` are where each answers."""

    shares_cores = False  # other hosts: their workers keep their own environment
    forks_procs = False  # procs start on the hosts' workers: each fork from its worker's server (`fork_args`)

    def __init__(self, placement: Placement | None) -> None:
        super().__init__(placement)
        self.hosts: Any = None  # a subclass attaches them
        self.names: list[str] = []
        self.addresses: list[str] = []
        self.ports: list[int] = []  # each host's worker port (its liveness probe)
        self.gone: set[int] = set()  # hosts found lost
        self._silent_since: dict[int, float] = {}  # host -> when its worker was first found not answering
        self._probed = 0.0
        self._placed: dict[str, list[int]] = {}  # each running role -> the host index of each of its procs
        self._stalled: list[StalledHandshakes] = []  # watchers of this process's Monarch port

    def host_indices(self, role: str, procs: int) -> list[int]:
        """The hosts `role`'s `procs` procs start on (one entry per proc, host-major: the plan's)."""
        return self.placement.host_indices(role, procs)

    def fork_args(self, role: str) -> list[str]:
        """`role`'s procs fork from their host worker's server (`workerforks`: one per worker, started by
        the first proc that asks, kept while the worker runs) on hosts without GPUs, as a local mesh's
        procs do (`LocalMesh._forks`), unless ``FORGE_NB_FORK_PROCS=0``. Not the roles that import no
        torch (`LIGHT_ROLES`): alone on a host, one would start a server only to import what it never uses."""
        gpus = any(self.placement.hosts[h].gpus > 0 for h in self.placement.host_indices(role))
        if gpus or not forks_wanted() or role.split("-")[0] in LIGHT_ROLES:
            return []
        return ["-m", "forge_nb.launch.forks.client", workerforks.FLAG]

    def master_addr(self, role: str) -> str | None:
        """Where `role`'s gang meets: the address of its first proc's host (which the other hosts reach)."""
        return self.addresses[self.placement.host_indices(role)[0]]

    def addresses_of(self, role: str, procs: int) -> tuple[str, ...]:
        """The address of the host of each of `role`'s `procs` procs (the one its worker is dialled at)."""
        return tuple(self.addresses[h] for h in self.host_indices(role, procs))

    def placed(self) -> dict[str, list[str]]:
        """Each running role -> the host of each of its procs, for `Session.status`."""
        return {role: [self.names[i] for i in where] for role, where in self._placed.items()}

    def roles_on(self, host: int) -> list[str]:
        """The running roles with a proc on host index `host`."""
        return [role for role, where in self._placed.items() if host in where]

    def lost(self) -> list[int]:
        """The hosts whose worker no longer answers, probed all at once."""
        if not self.addresses:
            return []
        with ThreadPoolExecutor(len(self.addresses)) as pool:
            up = list(pool.map(answers, self.addresses, self.ports))
        return [h for h, ok in enumerate(up) if not ok]

    def failed_first(self, lost: list[int]) -> list[int]:
        """Those of the `lost` hosts that failed themselves (a subclass asks the scheduler), not through another."""
        return lost

    def describe_host(self, host: int) -> str:
        """How host index `host` is known, for a message (a subclass adds the scheduler's view)."""
        return f"{self.names[host]} (its worker at {self.addresses[host]}:{self.ports[host]} does not answer)"

    def check_hosts(self, role: str) -> None:
        """Before `role`'s procs are started again: raise `HostLost` when a host of the mesh is gone
        (every host is probed: in a Slurm job one node's loss ends the job step that runs every node's
        worker, and the procs there with it)."""
        lost = self.lost()
        if lost:
            raise self.lost_error(lost, f"no proc is started on a host that is gone ({role} would be)")

    def watch(self) -> HostLost | None:
        """While a call waits (`runtime.calls.watch`): the hosts, probed every `PROBE_EVERY_S` -> `HostLost` once
        one has not answered for `HOST_LOST_AFTER_S`, instead of waiting on a call that cannot end."""
        now = time.monotonic()
        if now - self._probed < PROBE_EVERY_S:
            return None
        self._probed = now
        lost = self.lost()
        self._silent_since = {h: self._silent_since.get(h, now) for h in lost}
        if any(now - t >= HOST_LOST_AFTER_S for t in self._silent_since.values()):
            return self.lost_error(lost, "the call in flight cannot end")
        return None

    def lost_error(self, lost: list[int], why: str) -> HostLost:
        """`HostLost` naming each lost host (those that failed first, then those that went with them), the
        roles each held, and how to go on."""
        self.gone |= set(lost)
        first = self.failed_first(lost)
        where = "; ".join(f"{self.describe_host(h)} held {', '.join(self.roles_on(h)) or 'nothing'}" for h in first)
        if len(first) < len(lost):
            also = ", ".join(
                f"{self.names[h]} ({', '.join(self.roles_on(h)) or 'nothing'})" for h in lost if h not in first
            )
            where += f"; the workers on {also} do not answer either"
        trainer_alive = not self.gone & set(self._placed.get("trainer", []))
        keep = (
            "the trainer's procs still run: s.save(PATH) keeps its weights, then `%forge down` and start again"
            if trainer_alive
            else "the trainer went with it: `%forge down`, then start again from the last checkpoint (forge_nb.resume)"
        )
        return HostLost(f"lost: {where}. The run stopped: {why}; {keep}")

    def attached(self, listen: str, before: set[int]) -> None:
        """The hosts answer: watch them while calls wait (until `stop`), and this process's Monarch port at
        `listen` (what listens there now and did not `before`) for handshakes that never finish."""
        calls.watch(self.watch)
        self._stalled = [
            StalledHandshakes(port, f"session's Monarch port {listen}:{port}", REFUSED).start()
            for port in sorted(listening_ports(listen) - before)
        ]

    def stop(self, timeout: float | None = None) -> list[str]:
        """Stop every proc mesh -> errors, if any. After a host is gone, what is left of each role gets the
        stop at once, each waited `STOP_TIMEOUT_S` at most, and the roles it held report no error. In a job
        that is cancelled next (`cancels_job`), neither does a stop that ran out: one node's loss ends the
        job step that runs every node's worker, and the stops of procs on the nodes still up took ~50 s."""
        calls.unwatch(self.watch)
        for watcher in self._stalled:
            watcher.stop()
        self.gone |= set(self.lost())
        if not self.gone:
            return super().stop(timeout)
        hit = {r for r, where in self._placed.items() if self.gone & set(where)}
        for role in [r for r in hit if set(self._placed[r]) <= self.gone and r in self.proc_meshes]:
            self.retire(role)
            del self.proc_meshes[role]  # nothing of it is left to stop
        return super().stop(
            STOP_TIMEOUT_S, lambda role, error: role in hit or (self.cancels_job and isinstance(error, TimeoutError))
        )

    @property
    def cancels_job(self) -> bool:
        """Whether `stop` ends with the cancel of a job that holds every proc (a Slurm mesh's)."""
        return False

    def spawn(self, role: str, actor_class: type, spec: Any, procs: int = 1, gang: bool = False) -> Any:
        """Start `procs` procs for `role` on its hosts -> the actor mesh, one dimension "procs"."""
        indices = self.host_indices(role, procs)
        first, count = indices[0], len(set(indices))
        if sorted(set(indices)) == list(range(first, first + count)) and procs % count == 0:
            host_mesh = self.hosts.slice(hosts=slice(first, first + count))
        else:  # a layout hosts cannot slice to: all on the first (the plan never makes one)
            host_mesh, count = self.hosts.slice(hosts=slice(first, first + 1)), 1
        per_host = {"procs": procs // count}
        proc_mesh = host_mesh.spawn_procs(per_host=per_host, name=role, **self._bootstrap(role))
        self._placed[role] = [first + i for i in range(count) for _ in range(procs // count)]
        return self._start(role, proc_mesh, actor_class, spec, gang).flatten("procs")


class HostsMesh(PlacedMesh):
    """`PlacedMesh` on the workers at `hosts` (tls://HOST:PORT each) that hold the CA at `credentials` ("": the
    default folder)."""

    def __init__(self, hosts: list[str], placement: Placement, credentials: str = "") -> None:
        super().__init__(placement)
        parsed = [parse_host(h) for h in hosts]
        if not parsed:
            raise HostsError("mesh.kind='hosts' needs mesh.hosts: the tls://HOST:PORT of each host's worker")
        try:
            ca = Credentials.load(credentials or None)
        except CredentialsError as e:
            raise HostsError(f"{e} (mesh.credentials)") from None
        self.addresses, self.ports = [h for h, _ in parsed], [p for _, p in parsed]
        self.names = [f"{h}:{p}" for h, p in parsed]
        listen = route_source(*parsed[0])
        ca.use(listen)  # this process's certificate, for its own address: the workers dial it back
        before = listening_ports(listen)
        try:
            enable_transport(f"tls://{listen}:0")
        except RuntimeError as e:
            raise HostsError(
                f"mesh.kind='hosts' needs this kernel to use Monarch over TLS (at {listen}), but Monarch "
                f"already runs here over another transport ({e}). Restart the kernel and start the hosts "
                "session before any local one (forge_nb.up() runs each session in a server process of its own, "
                "where this cannot happen)."
            ) from None
        self.hosts = attach_to_workers(ca="trust_all_connections", workers=[f"tls://{h}:{p}" for h, p in parsed])
        try:
            wait(self.hosts.initialized, ATTACH_TIMEOUT_S)
        except Exception as e:
            raise HostsError(
                f"could not attach to the workers at {hosts} in {ATTACH_TIMEOUT_S:.0f} s ({type(e).__name__}: {e}); "
                "is `python -m forge_nb.launch.worker tls://HOST:PORT --credentials DIR` running on each, with the "
                f"credentials of mesh.credentials (CA {ca.fingerprint}, {ca.folder}), reachable from {listen}? "
                "A worker that refuses the session's certificate shows only as this timeout (Monarch's log says why)"
            ) from None
        self.attached(listen, before)
