"""The placement plan: which procs each role gets, on which host, with which GPUs.

A pure function of the config and the hosts (`plan`), computed before anything starts; the meshes only
carry it out (`launch.local`, `mesh.hosts`, `launch.slurm` read each proc's host and environment from it),
and `Session.status()`, `%forge status` and the sidebar print it. A plan that cannot fit is a
`ConfigError` naming the counts.

Hosts, by `mesh.kind`: "local" is this host, "hosts" the workers at `mesh.hosts`, "slurm" the
`slurm.nodes` nodes of the session's job. On several, the trainer (and a reference model) takes the
first `mesh.trainer_hosts`, its procs spread evenly; the generator replicas the next
`mesh.generator_hosts` (by default as many as divide the replicas evenly); the reward procs, judges,
env procs and the live-code checker the last host, beside the last replicas when no host is left
(`shape`). One host holds everything. A Slurm shape that leaves a node idle is a `ConfigError`.

GPUs, on each host that has some (and `model.device` is not "cpu"): every trainer proc gets one, each
generator replica `engine.tensor_parallel_size` of its own after them; a reference model's proc i
shares trainer proc i's GPU (it is sharded like the trainer); reward, judge, env and checker procs get
none (they run on the CPU). When the GPUs do not fit (`mesh.share_gpus`: "auto" shares then, "yes"
always), the generator replicas share the trainer's GPUs instead (vLLM takes
`engine.gpu_memory_utilization` of each). Each proc sees only its own GPUs (``CUDA_VISIBLE_DEVICES``);
the trainer's and the reference's procs get ``LOCAL_RANK``, their index among the role's procs on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forge_nb.config import Config, ConfigError

#: Roles whose procs form one torch.distributed gang (FSDP2), one GPU each.
GANGS = ("trainer", "reference")
#: Roles spawned later, by name family ("judge", "judge-2", ...): where they go, never GPUs.
_BESIDE_REWARD = ("judge", "env", "live_check")


@dataclass(frozen=True)
class Host:
    """A host the roles can go to: its name (for status) and the GPUs the plan may give out there."""

    name: str
    gpus: int


@dataclass(frozen=True)
class Slot:
    """Proc `proc` of `role`: on host index `host`, with the host's GPUs `devices` (empty: the CPU);
    `local_rank` is its index among the role's procs on that host."""

    role: str
    proc: int
    host: int
    devices: tuple[int, ...]
    local_rank: int


@dataclass(frozen=True)
class Placement:
    """Every planned proc (`slots`, each role's in proc order: host-major, as a mesh spawns them)."""

    hosts: tuple[Host, ...]
    slots: tuple[Slot, ...]
    shared: bool = False  # generator replicas run on the trainer's GPUs

    def of(self, role: str) -> list[Slot]:
        """`role`'s slots; a role spawned later by family name ("judge-2") gets its family's place."""
        found = [s for s in self.slots if s.role == role]
        if found:
            return found
        family = role.split("-")[0]
        return [Slot(role, 0, h, (), 0) for h in self.host_indices(family, 1)]

    def host_indices(self, role: str, procs: int | None = None) -> list[int]:
        """The host of each of `role`'s procs (a role not in the plan: beside the reward procs)."""
        planned = [s.host for s in self.slots if s.role == role]
        if planned and (procs is None or procs == len(planned)):
            return planned
        reward = [s.host for s in self.slots if s.role == "reward"] or [0]
        return [reward[-1]] * (procs or 1)

    def env(self, role: str, proc: int) -> dict[str, str]:
        """Environment of `role`'s proc `proc`: ``CUDA_VISIBLE_DEVICES`` on a host with GPUs (empty for
        a CPU proc there, so it cannot take one by accident), ``LOCAL_RANK`` in a gang."""
        slots = self.of(role)
        slot = slots[proc] if proc < len(slots) else slots[-1]
        env = {}
        if self.hosts[slot.host].gpus > 0:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in slot.devices)
        if role in GANGS:
            env["LOCAL_RANK"] = str(slot.local_rank)
        return env

    def device(self, role: str, asked: str) -> str:
        """The torch device `role`'s procs run on: "cpu" where the plan gave them no GPU on a host that
        has some; else `asked` (model.device: "auto" is resolved in the proc, which sees only its GPUs)."""
        slots = self.of(role)
        if any(self.hosts[s.host].gpus > 0 for s in slots) and not any(s.devices for s in slots):
            return "cpu"
        return asked

    def rows(self) -> list[dict[str, Any]]:
        """One row per proc: role, proc, host, devices (for status tables and the sidebar)."""
        return [
            {"role": s.role, "proc": s.proc, "host": self.hosts[s.host].name, "devices": list(s.devices)}
            for s in self.slots
        ]


def plan(config: Config, hosts: list[Host]) -> Placement:
    """Where every role's procs go and which GPUs each gets (see the module docstring) -> `Placement`.
    Raises `ConfigError` when the GPUs a host would need are more than it has."""
    m = config.mesh
    counts = {"generator": m.generator_procs, "trainer": m.trainer_procs, "reward": m.reward_procs}
    if config.algorithm.kl_coef > 0 and not config.lora.enabled:  # with LoRA the trainer is the reference
        counts["reference"] = m.trainer_procs
    where = {role: _hosts_of(config, role, procs, len(hosts)) for role, procs in counts.items()}
    use_gpus = config.model.device != "cpu"
    slots: list[Slot] = []
    shared = False
    for h, host in enumerate(hosts):
        here = {role: sum(1 for x in where[role] if x == h) for role in counts}
        devices, host_shared = _devices(config, host, here) if use_gpus and host.gpus > 0 else ({}, False)
        shared = shared or host_shared
        for role in counts:
            first = sum(1 for x in where[role] if x < h)  # procs of the role on earlier hosts (host-major order)
            for local in range(here[role]):
                got = devices.get(role, [()] * here[role])[local]
                slots.append(Slot(role, first + local, h, got, local))
    order = {role: i for i, role in enumerate(counts)}
    slots.sort(key=lambda s: (order[s.role], s.proc))
    return Placement(tuple(hosts), tuple(slots), shared)


def _hosts_of(config: Config, role: str, procs: int, hosts: int) -> list[int]:
    """The host index of each of `role`'s procs, host-major (a mesh spawns the same count on each of a
    role's hosts), by `shape`."""
    trainer, generator = shape(config, hosts)
    if hosts == 1:
        return [0] * procs
    if role in GANGS:
        return _spread(trainer, procs)
    if role == "generator":
        return _spread(generator, procs)
    return [hosts - 1] * procs


def _spread(hosts: list[int], procs: int) -> list[int]:
    return [h for h in hosts for _ in range(procs // len(hosts))]


def shape(config: Config, hosts: int) -> tuple[list[int], list[int]]:
    """(the trainer's hosts, the generator replicas' hosts) of a mesh of `hosts` hosts: the trainer on the
    first `mesh.trainer_hosts`, the replicas on the next `mesh.generator_hosts` (0: the most hosts that
    divide `mesh.generator_procs` evenly and are free); the reward procs (and judges, env procs, the
    checker) on the last host, beside the last replicas when no host is left. One host holds everything.
    Raises `ConfigError` for a shape that cannot be placed, and in a Slurm job for nodes it would leave idle."""
    m = config.mesh
    if hosts == 1:
        if m.trainer_hosts > 1 or m.generator_hosts > 1:
            raise ConfigError(
                f"mesh.trainer_hosts={m.trainer_hosts}, mesh.generator_hosts={m.generator_hosts}: the mesh has "
                f"1 host{_nodes_hint(config)}"
            )
        return [0], [0]
    trainers, free = m.trainer_hosts, hosts - m.trainer_hosts
    if free < 1:
        raise ConfigError(
            f"mesh.trainer_hosts={trainers} leaves no host for the generator: the mesh has {hosts}{_nodes_hint(config)}"
        )
    if m.trainer_procs % trainers:
        raise ConfigError(
            f"mesh.trainer_procs={m.trainer_procs} cannot be spread evenly over mesh.trainer_hosts={trainers} "
            "(each host runs the same number of the trainer's procs)"
        )
    replicas = m.generator_procs
    generators = m.generator_hosts or max(d for d in range(1, min(free, replicas) + 1) if replicas % d == 0)
    if generators > free or replicas % generators:
        raise ConfigError(
            f"mesh.generator_hosts={generators}: {free} host(s) are left after the trainer's {trainers} and "
            f"mesh.generator_procs={replicas} must spread evenly over them"
        )
    idle = hosts - trainers - generators - 1
    if config.mesh.kind == "slurm" and idle > 0:
        raise ConfigError(
            f"slurm.nodes={hosts} but the shape uses {hosts - idle}: trainer {trainers} node(s) "
            f"(mesh.trainer_hosts), generator {generators} (mesh.generator_hosts, mesh.generator_procs={replicas}), "
            "reward procs 1; ask for fewer nodes or spread the trainer or the generator over more"
        )
    return list(range(trainers)), list(range(trainers, trainers + generators))


def _nodes_hint(config: Config) -> str:
    return " (slurm.nodes)" if config.mesh.kind == "slurm" else " (mesh.hosts)" if config.mesh.kind == "hosts" else ""


def _devices(config: Config, host: Host, here: dict[str, int]) -> tuple[dict[str, list[tuple[int, ...]]], bool]:
    """GPUs of each role's procs on `host` (`here`: how many procs of each role it holds) -> (devices
    per role and proc, whether the generator replicas share the trainer's GPUs)."""
    tp = config.engine.tensor_parallel_size
    trainers, replicas = here["trainer"], here["generator"]
    separate = trainers + replicas * tp
    share = config.mesh.share_gpus == "yes" or (config.mesh.share_gpus == "auto" and separate > host.gpus)
    what = f"trainer {trainers} x 1, generator {replicas} x engine.tensor_parallel_size {tp}"
    if not share and separate > host.gpus:
        raise ConfigError(
            f"host {host.name}: the placement needs {separate} GPUs ({what}) and the host has {host.gpus}; "
            "ask for fewer procs, or set mesh.share_gpus='yes' to run the generator on the trainer's GPUs"
        )
    if share and (trainers > host.gpus or tp > host.gpus):
        raise ConfigError(
            f"host {host.name}: even sharing GPUs ({what}) the placement needs {max(trainers, tp)} GPUs and "
            f"the host has {host.gpus}; set mesh.trainer_procs and engine.tensor_parallel_size to at most "
            f"{host.gpus}"
        )
    trainer = [(g,) for g in range(trainers)]
    start = 0 if share else trainers
    generator = [tuple((start + i * tp + k) % host.gpus for k in range(tp)) for i in range(replicas)]
    devices = {"trainer": trainer, "generator": generator, "reference": trainer[: here.get("reference", 0)]}
    return devices, share and replicas > 0


def hosts_for(config: Config, names: list[str] | None = None) -> list[Host]:
    """The hosts a config runs on, with the GPUs the plan may give out on each: `mesh.gpus_per_host`,
    else Slurm's ``slurm.gpus_per_node``, else the GPUs this host has (hosts of a "hosts" mesh are
    taken to be alike). `names`: the hosts' names when known (a Slurm job's nodes, the workers)."""
    m = config.mesh
    if m.kind == "slurm":
        count = slurm_nodes(config)
        gpus = config.slurm.gpus_per_node if m.gpus_per_host < 0 else m.gpus_per_host
        default = [f"node{i}" for i in range(count)] if count > 1 else ["node"]
    else:
        count = len(m.hosts) if m.kind == "hosts" else 1
        gpus = m.gpus_per_host if m.gpus_per_host >= 0 else _local_gpus()
        default = m.hosts if m.kind == "hosts" else ["localhost"]
    names = names or default
    return [Host(names[i] if i < len(names) else f"host{i}", gpus) for i in range(count)]


def slurm_nodes(config: Config) -> int:
    """The nodes a Slurm session's job asks for (`slurm.separate_hosts`, from older configs: 3)."""
    return 3 if config.slurm.separate_hosts else config.slurm.nodes


def _local_gpus() -> int:
    import torch

    return torch.cuda.device_count()
