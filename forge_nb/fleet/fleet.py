"""The session's actors as one object: spawned from one `Config` onto a mesh, every call the session makes on
them, and how each role starts afresh when its procs are lost.

Roles: generator replicas, the trainer (one proc, or a gang), reward workers, the live-code checker and (with
``algorithm.kl_coef > 0``) the frozen reference model, each in procs of its own on a mesh the fleet owns; judge
actors and env procs start when first needed. Batches are split over a role's procs here: contiguous shards sent
concurrently, results put back in order. Generator replicas always serve the same policy version; a disagreement
is an error. Parts with a concept of their own: `recovery` (when a role is started afresh and a call issued
again), `weight_sync` (attach and refresh; the only writer of the policy versions), `checker`, `judges`, `envs`.
"""

from __future__ import annotations

import dataclasses
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monarch.actor import ActorError
from tqdm.auto import tqdm

from forge_nb.actors.base import ActorInfo
from forge_nb.actors.env import EnvSpec
from forge_nb.actors.generator import Generation, Generator, GeneratorSpec
from forge_nb.actors.reference import Reference, ReferenceSpec
from forge_nb.actors.reward import RewardSpec, RewardWorker
from forge_nb.actors.trainer import Trainer, TrainerSpec, TrainResult
from forge_nb.config import Config, LoraConfig
from forge_nb.engines.base import SamplingParams
from forge_nb.fleet.checker import ROLE as CHECKER
from forge_nb.fleet.checker import Checker
from forge_nb.fleet.envs import ROLE as ENV
from forge_nb.fleet.envs import EnvPool
from forge_nb.fleet.judges import ROLE as JUDGE
from forge_nb.fleet.judges import JudgePool
from forge_nb.fleet.recovery import Recovery, TrainerLost
from forge_nb.fleet.weight_sync import WeightSync
from forge_nb.launch.local import LocalMesh
from forge_nb.launch.placement import Placement, hosts_for, plan, slurm_nodes
from forge_nb.launch.slurm import SlurmMesh
from forge_nb.live.capture import LiveCode
from forge_nb.live.registry import Member
from forge_nb.live.validate import LossProbe
from forge_nb.parallel.policy import AdamStep
from forge_nb.rewards.batch import RewardBatch, RewardSample, Scores
from forge_nb.rl.batch import TrainBatch
from forge_nb.rl.episode import Episode
from forge_nb.rl.target_batch import Datums
from forge_nb.runtime import last_words, supervision
from forge_nb.runtime.calls import GangFuture, gang_call, on_gang, replica, shards, wait
from forge_nb.versions import PolicyVersions
from forge_nb.weights.refresh import RefreshError, RefreshReport


class ReplicaMismatch(RuntimeError):
    """Generator replicas answered with different policy versions."""


Event = Callable[[str, str], None]  # (role, what happened): a proc replaced, ...


@dataclass(frozen=True)
class StartFrom:
    """Where the actors start from when a session resumes: a checkpoint's weights and live-code
    versions (its policy versions are in the session's `PolicyVersions`)."""

    trainer_dir: str
    generator_dir: str
    loss_version: int
    reward_version: int


class Fleet:
    """Every actor of one session, on a mesh it owns. `on_event(role, what)` hears of every proc replaced. A
    role whose proc dies is started afresh and the call issued again (`recovery`)."""

    def __init__(
        self,
        config: Config,
        engine: str,
        pad_id: int,
        rewards: dict[str, Member],
        loss: LiveCode,
        versions: PolicyVersions,
        on_event: Event | None = None,
        start: StartFrom | None = None,
    ) -> None:
        """Start the mesh (this host's procs, a Slurm job's nodes: `SlurmError` if that fails, or the workers at
        `mesh.hosts`) and spawn every role on it; returns before the actors' constructors finish (`wait_ready`).
        `versions` is the session's record of policy versions: `weight_sync` keeps it current."""
        self.on_event = on_event or (lambda role, what: None)
        self.placement = plan(config, hosts_for(config))  # before anything starts: a ConfigError if it cannot fit
        supervision.install()  # failures reach the session, not the kernel's main thread
        self.mesh = mesh = _start_mesh(config, self.placement)
        self.placement = mesh.placement
        try:
            self._spawn(config, engine, pad_id, rewards, loss, versions, start)
        except BaseException:
            mesh.stop()
            raise

    def _spawn(
        self,
        config: Config,
        engine: str,
        pad_id: int,
        rewards: dict[str, Member],
        loss: LiveCode,
        versions: PolicyVersions,
        start: StartFrom | None,
    ) -> None:
        """Every role's actors on the mesh, from one spec each."""
        m, mesh = config.mesh, self.mesh
        self.kind, self.engine = m.kind, engine
        self.reward_timeout_s, self.threads = config.live.timeout_s, m.threads_per_proc
        self.generator_procs, self.reward_procs, self.trainer_procs = m.generator_procs, m.reward_procs, m.trainer_procs
        self.info: dict[str, list[ActorInfo]] = {}  # filled by wait_ready
        self.model_dir = str(config.model.resolved_path())  # the base model (a fresh trainer loads it)
        self.recovery = Recovery(self)
        self.weights = WeightSync(self, versions, config.weights)
        self.restore_from: Callable[[], Path | None] | None = None  # the last checkpoint, to restore a trainer
        # The torch engine on the GPUs the plan gave the generator procs, the CPU where it gave none.
        served_on = self.placement.device("generator", config.model.device)
        self._generator_spec = dataclasses.replace(GeneratorSpec.from_config(config, engine), device=served_on)
        device = self.placement.device("trainer", config.model.device)
        # The weights streams' secret (`weights.stream`): made here, handed to the trainer in its spec and to the
        # generators in the manifest (`weight_sync`); each rank serves at its host's address on the mesh's network.
        self.stream_secret = secrets.token_bytes(32)
        self._trainer_spec = dataclasses.replace(
            TrainerSpec.from_config(config, pad_id, loss),
            device=device,
            stream_hosts=mesh.addresses_of("trainer", m.trainer_procs),
            stream_secret=self.stream_secret,
        )
        self.gang = config.trainer.sharded(m.trainer_procs)
        # a rank whose peers answered a call and that does not answer this much later is hung (`GangFuture`)
        self.straggler_s = config.trainer.collective_timeout_s if self.gang else None
        reward_version = 0
        if start is not None:
            # With LoRA the checkpoint holds adapters: the generator serves the base with the saved one.
            served = {"adapter_dir" if config.lora.enabled else "model_dir": start.generator_dir}
            self._generator_spec = dataclasses.replace(self._generator_spec, **served, version=versions.served)
            self._trainer_spec = dataclasses.replace(
                self._trainer_spec, resume_from=start.trainer_dir, loss_version=start.loss_version
            )
            reward_version = start.reward_version
        self.generator = mesh.spawn("generator", Generator, self._generator_spec, procs=self.generator_procs)
        self.trainer = mesh.spawn("trainer", Trainer, self._trainer_spec, procs=self.trainer_procs, gang=self.gang)
        self._reward_set = (rewards, reward_version)  # the live set, for replacement procs
        self.rewards = mesh.spawn("reward", RewardWorker, self._reward_spec(), procs=self.reward_procs)
        self.reference = None
        self._reference_spec = dataclasses.replace(ReferenceSpec.from_config(config, pad_id), device=device)
        # With LoRA the trainer answers for the reference: its base with the adapter off, no second copy.
        self.reference_on_trainer = config.algorithm.kl_coef > 0 and config.lora.enabled
        if config.algorithm.kl_coef > 0 and not self.reference_on_trainer:
            self.reference = mesh.spawn("reference", Reference, self._reference_spec, self.trainer_procs, self.gang)
        self.checker = Checker(mesh, 1, self._checker_replaced)
        self.judges = JudgePool(self, config)  # judge actors, started when a reward first asks one
        self.envs = EnvPool(self, EnvSpec.from_config(config), m.reward_procs, config.agent.batch_timeout_s)

    # -- start and stop ------------------------------------------------------------------------------
    def wait_ready(self) -> dict[str, list[ActorInfo]]:
        """Wait until every actor's constructor has finished (or raise its error) -> who answered."""
        roles = {"generator": self.generator, "trainer": self.trainer, "reward": self.rewards}
        if self.reference is not None:
            roles["reference"] = self.reference
        ready = {}
        with tqdm(total=len(roles), desc="forge_nb up: starting actors", leave=False) as bar:
            for role, actors in roles.items():
                bar.set_postfix_str(f"generator ({self.engine} engine)" if role == "generator" else role)
                ready[role] = list(wait(actors.ready.call()).values())
                bar.update()
        ready[CHECKER] = self.checker.ready()
        self.info = ready
        return ready

    def stop(self) -> list[str]:
        """Stop every proc (and the Slurm job) -> errors, if any."""
        try:  # normally done right after start; this covers a start that failed half-way
            if not getattr(self.mesh, "gone", None):  # a host is gone: a trainer call waits ~20 s for HostLost
                self.unlink_shared_memory()
        except Exception:
            pass
        errors = self.mesh.stop()
        last_words.heard(pid for role in self.info for pid in self.local_pids(role))  # words nobody will report
        return errors

    def refusals(self, timeout_s: float = 5.0) -> dict[str, int]:
        """What the listeners of every proc (trainer ranks' weights streams, env procs' endpoints) and of their
        hosts' workers refused so far, ``"LISTENER: WHY"`` -> count. A role that does not answer in `timeout_s`
        (busy, or gone: recovery deals with that at its next call) is left out this time."""
        roles = [self.trainer, self.generator, self.rewards] + ([self.envs.actors] if self.envs.running else [])
        calls = [actors.refusals.call() for actors in roles]
        found: dict[str, int] = {}
        for call in calls:
            try:
                answers = wait(call, timeout_s).values()
            except Exception:
                continue
            for totals in answers:
                for key, count in totals.items():
                    found[key] = max(found.get(key, 0), count)
        return found

    # -- who runs where --------------------------------------------------------------------------------
    @property
    def has_reference(self) -> bool:
        """Whether a reference model runs (`algorithm.kl_coef > 0`): its own actor, or with LoRA the trainer."""
        return self.reference is not None or self.reference_on_trainer

    @property
    def pids(self) -> dict[str, list[int]]:
        """Process ids of each role's procs (once `wait_ready` has returned)."""
        return {role: [i.pid for i in infos] for role, infos in self.info.items()}

    def local_pids(self, role: str) -> list[int]:
        """Pids of `role`'s procs that run on this host (those a replacement may have to kill)."""
        here = socket.gethostname()
        return [i.pid for i in self.info.get(role, []) if i.hostname == here]

    def describe(self) -> dict[str, Any]:
        """The mesh for `Session.status`: kind, Slurm job or hosts, procs, engine, weights transport."""
        job = getattr(self.mesh, "job_id", None)
        return {
            "mesh": self.kind,
            "slurm_job": job,
            **({"hosts": self.mesh.placed()} if hasattr(self.mesh, "placed") else {}),
            "procs": self.pids,
            "placement": self.placement_rows(),
            "engine": self.engine,
            "weights_transport": self.weights.chosen,
        }

    def placement_rows(self) -> list[dict[str, Any]]:
        """The plan, one row per proc (role, proc, host, devices), with each running proc's pid."""
        rows = []
        for row in self.placement.rows():
            infos = self.info.get(row["role"], [])
            rows.append({**row, "pid": infos[row["proc"]].pid if row["proc"] < len(infos) else None})
        return rows

    # -- the step's calls ------------------------------------------------------------------------------
    def generate(self, prompts: list[str], sampling: SamplingParams) -> Generation:
        """Split the prompts over the generator replicas -> completions in prompt order, the policy
        version, and the slowest replica's seconds."""
        return self.recovery.supervised("generator", lambda: self._generate(prompts, sampling))

    def _generate(self, prompts: list[str], sampling: SamplingParams) -> Generation:
        parts = shards(len(prompts), self.generator_procs)
        futures = [
            replica(self.generator, i, self.generator_procs).generate.call_one(
                prompts[part], _replica_sampling(sampling, i)
            )
            for i, part in enumerate(parts)
        ]
        results: list[Generation] = [wait(f) for f in futures]
        versions = {r.policy_version for r in results}
        if len(versions) != 1:
            raise ReplicaMismatch(f"generator replicas serve different policy versions {sorted(versions)}")
        completions = [group for r in results for group in r.completions]
        return Generation(completions, versions.pop(), max(r.seconds for r in results))

    def score(self, batch: RewardBatch) -> list[tuple[slice, Scores]]:
        """Rewards: split the batch evenly over the reward workers -> (which samples, their scores) per shard.
        When a reward ran past its timeout, the reward procs are replaced before this returns. When a judge a
        reward asked could not answer (its proc died, it hung, it was not running yet), it is started afresh and
        the batch scored once more, as a call to a dead proc is (`recovery`)."""
        parts = shards(len(batch), self.reward_procs)

        def call() -> list[tuple[slice, Scores]]:
            futures = [
                replica(self.rewards, i, self.reward_procs).score.call_one(batch.shard(p)) for i, p in enumerate(parts)
            ]
            return [(part, wait(future)) for part, future in zip(parts, futures)]

        for _ in range(2):  # the second time only after judges that could not answer were restored
            results = self.recovery.supervised("reward", call)
            if any(scores.timed_out for _, scores in results):
                self.replace_rewards(f"reward v{results[0][1].reward_version} ran past its timeout")
            if not self.judges.observe(batch.step, [scores for _, scores in results]):
                break
        return results

    def ask_reference(self, episodes: list[Episode]) -> GangFuture | None:
        """Ask the reference model for the episodes' logprobs -> the future, for `attach_reference` (None: no
        reference runs, or nothing to ask)."""
        if not self.has_reference or not episodes:
            return None
        ids = [e.prompt_ids for e in episodes], [e.completion_ids for e in episodes]
        if self.reference_on_trainer:
            return gang_call(self.trainer, "reference_logprobs", *ids, straggler_s=self.straggler_s)
        # every proc: a sharded reference runs its part of each
        return gang_call(self.reference, "logprobs", *ids, straggler_s=self.straggler_s)

    def attach_reference(self, episodes: list[Episode], asked: GangFuture | None = None) -> float:
        """Wait for what `ask_reference` asked of `episodes` and store it on them (`Episode.ref_logprobs`) -> seconds
        waited (asked again of a fresh reference proc if the first one died or hung). Nothing asked: the
        episodes without reference logprobs (a rollout made before the reference ran) are asked now."""
        if asked is None:
            episodes = [e for e in episodes if e.ref_logprobs is None]
            asked = self.ask_reference(episodes)
        if asked is None:
            return 0.0
        start = time.perf_counter()
        pending = iter([asked])  # then, if its procs were lost, a call to the fresh ones

        def answer() -> list[list[float]]:
            return wait(next(pending, None) or self.ask_reference(episodes))[0]

        role = "trainer" if self.reference_on_trainer else "reference"
        logprobs = self.recovery.supervised(role, answer, since=asked.issued)
        for e, row in zip(episodes, logprobs):
            e.ref_logprobs = row
        return time.perf_counter() - start

    def train_batch(
        self, episodes: list[Episode], keep_logprobs: bool = True, mask_truncated: bool = False
    ) -> TrainResult:
        """The trainer's steps on `episodes` (`Trainer.train_batch`; their reference logprobs attached when a
        reference runs); the trainer publishes the next policy version. `keep_logprobs`: the answer carries the
        trainer's per-token logprobs; `mask_truncated`: see `TrainBatch.of`."""
        batch = TrainBatch.of(episodes, self.has_reference, keep_logprobs, mask_truncated)
        result = self.recovery.supervised(
            "trainer", lambda: on_gang(self.trainer, "train_batch", batch, straggler_s=self.straggler_s)
        )
        self.weights.published(result.policy_version)
        return result

    def refresh(self) -> RefreshReport:
        """Every generator replica loads the version the trainer published last (`weight_sync`)."""
        return self.recovery.supervised("generator", lambda: self.weights.refresh())

    # -- Tinker's calls (`server.tinker`): on the trainer gang and the generator replicas ------------------
    def forward_backward(
        self, datums: Datums, loss: str, config: dict[str, float], forward_only: bool
    ) -> tuple[list[list[float]], list[float]]:
        """Tinker's forward_backward on the trainer (every rank gets the datums and runs its part): the loss's
        gradient added to what it accumulated -> (each datum's logprobs, each one's loss). Not issued again on a
        fresh trainer when its proc died: the gradients accumulated died with it."""
        args = (datums, loss, config, forward_only)
        return on_gang(self.trainer, "forward_backward", *args, straggler_s=self.straggler_s)

    def optim_step(self, step: AdamStep) -> dict[str, float]:
        """Tinker's optim_step on the trainer, which publishes the next policy version -> its metrics."""
        metrics = on_gang(self.trainer, "optim_step", step, straggler_s=self.straggler_s)
        self.weights.published(metrics["policy_version"])
        return metrics

    def load_state(self, path: str, optimizer: bool) -> int:
        """The trainer loads the state `save_state` wrote at `path` (`optimizer`: its optimizer state too) and
        publishes it as the next policy version -> that version."""
        version = on_gang(self.trainer, "load_state", path, optimizer, straggler_s=self.straggler_s)
        self.weights.published(version)
        return version

    def save_state(self, path: str) -> int:
        """The trainer's weights and optimizer state at `path` (`Trainer.save_state`) -> their policy version."""
        return self.recovery.trainer_saves(lambda: on_gang(self.trainer, "save_state", path))

    def served_logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Teacher-forced logprobs (temperature 1) of each completion after its prompt, under the weights the
        generator replicas serve (split over them, as `generate` splits prompts)."""

        def call() -> list[list[float]]:
            parts = shards(len(prompt_ids), self.generator_procs)
            futures = [
                replica(self.generator, i, self.generator_procs).logprobs.call_one(
                    prompt_ids[part], completion_ids[part]
                )
                for i, part in enumerate(parts)
            ]
            return [row for f in futures for row in wait(f)[0]]

        return self.recovery.supervised("generator", call)

    def remodel(self, lora: LoraConfig | None) -> None:
        """A fresh trainer on the base model (a new LoRA adapter `lora`, or every weight trained: None), its
        weights published as the next policy version; the generator replicas start afresh as well when they
        serve differently (an adapter or whole weights, another rank or targets), and every replica attaches to
        the new trainer (`refresh` then loads the fresh version). What the old trainer held (weights, optimizer
        state, accumulated gradients) is gone: save it first."""
        before = self._trainer_spec.lora
        fresh = self.weights.versions.trained + 1
        self._trainer_spec = dataclasses.replace(self._trainer_spec, lora=lora, resume_from="", version=fresh)
        old = self.local_pids("trainer")
        self.trainer = self.mesh.replace("trainer", Trainer, self._trainer_spec, old, self.trainer_procs, kill=True)
        self.info["trainer"] = wait(gang_call(self.trainer, "ready"))
        self.weights.published(fresh)
        if lora != before:
            served = self.weights.versions.served
            self._generator_spec = dataclasses.replace(
                self._generator_spec, model_dir=self.model_dir, lora=lora, adapter_dir="", version=served
            )
            old = self.local_pids("generator")
            self.generator = self.mesh.replace(
                "generator", Generator, self._generator_spec, old, procs=self.generator_procs
            )
            self.info["generator"] = list(wait(self.generator.ready.call()).values())
            self.envs.attach_generator()
        self.weights.attach()
        what = f"a LoRA adapter of rank {lora.r}" if lora is not None else "every weight"
        self.on_event("trainer", f"a fresh model from {self.model_dir}, training {what}, as policy v{fresh}")

    # -- live code -------------------------------------------------------------------------------------
    def set_rewards(self, members: dict[str, Member], version: int) -> None:
        wait(self.rewards.set_rewards.call(members, version))
        self._reward_set = (members, version)

    def set_loss(self, code: LiveCode, version: int) -> None:
        on_gang(self.trainer, "set_loss", code, version)

    def check_reward(self, code: LiveCode, samples: list[RewardSample], timeout: float) -> list[float]:
        return self.judges.serve(lambda: self.checker.check_reward(code, samples, timeout))

    def check_loss(self, code: LiveCode, probe: LossProbe, has_reference: bool, timeout: float) -> float:
        return self.checker.check_loss(code, probe, has_reference, timeout)

    def rescore(self, members: dict[str, Member], samples: list[RewardSample], timeout: float) -> Scores:
        return self.judges.serve(lambda: self.checker.score(members, samples, timeout))

    # -- weights on disk ---------------------------------------------------------------------------------
    def save_weights(self, folder: Path, generator_too: bool) -> None:
        """The trainer's state into folder/trainer; the served weights into folder/generator when they
        are not the trainer's (the torch engine only)."""
        self.recovery.trainer_saves(lambda: on_gang(self.trainer, "save_state", str(folder / "trainer")))
        if generator_too:
            wait(self.generator.slice(procs=0).save_weights.call_one(str(folder / "generator")))

    def save(self, path: str, merged: bool = True) -> int:
        """The trainer's weights as an HF model directory at `path` (with LoRA the adapter, and with `merged` the
        merged model in path/merged) -> their policy version."""
        return self.recovery.trainer_saves(lambda: on_gang(self.trainer, "save", path, merged))

    def unlink_shared_memory(self) -> None:
        on_gang(self.trainer, "unlink_shared_memory")

    def checksums(self, *roles: str) -> dict[str, Any]:
        """(version, weights checksum) of the trainer, generator replica 0 and every replica (`roles`: only those of
        "trainer", "generator", "generator_replicas"): a debugging aid (each gathers every whole tensor of its
        weights). Naming roles reads nothing of the others (a generator's weights while the trainer's host is away)."""
        reads = {
            "trainer": lambda: on_gang(self.trainer, "checksum"),
            "generator": lambda: wait(self.generator.slice(procs=0).checksum.call_one()),
            "generator_replicas": lambda: list(wait(self.generator.checksum.call()).values()),
        }
        unknown = set(roles) - set(reads)
        if unknown:
            raise ValueError(f"checksums: no role {sorted(unknown)}; one of {list(reads)}")
        return {role: read() for role, read in reads.items() if not roles or role in roles}

    # -- roles started afresh (`recovery` decides when) ----------------------------------------------------
    def replace(self, role: str, cause: str) -> None:
        """Replace `role`'s procs (they died, or hang) and bring the new actors to where the old ones were."""
        if role == "trainer":
            return self.restore_trainer(cause)
        old = self.local_pids(role)
        if role == "reward":
            return self.replace_rewards(f"respawned after {cause}")
        if role == CHECKER:
            return self.checker.replace(f"respawned after {cause}")
        if role == JUDGE:
            return self.judges.respawn(cause)
        if role == ENV:
            self.envs.start()
        elif role == "reference":
            # killed first: it holds frozen weights only, and a hung rank would hold a clean stop
            self.reference = self.mesh.replace(
                role, Reference, self._reference_spec, old, self.trainer_procs, kill=True
            )
            self.info[role] = wait(gang_call(self.reference, "ready"))
        elif role == "generator":
            self._replace_generator(old)
        self.on_event(role, f"procs {old} died ({cause}); respawned as {self.pids[role]}")

    def replace_rewards(self, why: str) -> None:
        """Fresh reward procs with the live reward set (a reward hung or spun in the old ones: stopping
        them is the only way to stop it)."""
        old = self.local_pids("reward")
        self.rewards = self.mesh.replace("reward", RewardWorker, self._reward_spec(), old, procs=self.reward_procs)
        self.info["reward"] = list(wait(self.rewards.ready.call()).values())
        self.judges.attach(self.rewards)
        self.on_event("reward", f"procs {old} replaced by {self.pids['reward']}: {why}")

    def restore_trainer(self, cause: str) -> None:
        """A new trainer from the last checkpoint (checkpoint.on_trainer_failure="restore"), the generators
        attached to its weights and refreshed to the version it reports when ready; else `TrainerLost`."""
        versions = self.weights.versions
        checkpoint = self.restore_from() if self.restore_from is not None else None
        if checkpoint is None:
            how = "" if self.restore_from else " (or set checkpoint.on_trainer_failure='restore' and checkpoint.every)"
            raise TrainerLost(
                f"the trainer's proc died ({cause}) with the weights and optimizer state of policy version "
                f"{versions.trained}; start again from a checkpoint: forge_nb.resume(path){how}"
            )
        old, lost = self.local_pids("trainer"), versions.trained
        spec = dataclasses.replace(self._trainer_spec, resume_from=str(Path(checkpoint) / "trainer"))
        # killed first: a rank that died left its peers' group unusable, and one hung holds a clean stop
        self.trainer = self.mesh.replace("trainer", Trainer, spec, old, self.trainer_procs, kill=True)
        self.info["trainer"] = wait(gang_call(self.trainer, "ready"))
        self.weights.published(self.info["trainer"][0].details["policy_version"])
        self.weights.attach()
        self.weights.refresh()
        self.on_event(
            "trainer", f"procs {old} died ({cause}) at policy v{lost}; restored v{versions.trained} from {checkpoint}"
        )

    def _replace_generator(self, old: list[int]) -> None:
        """New generators, attached to the published weights and refreshed to the version served."""
        self.generator = self.mesh.replace(
            "generator", Generator, self._generator_spec, old, procs=self.generator_procs
        )
        self.info["generator"] = list(wait(self.generator.ready.call()).values())
        self.envs.attach_generator()
        self.weights.reattach()
        try:
            self.weights.refresh(self.weights.versions.served)
        except ActorError as e:
            if not isinstance(e.exception, RefreshError):
                raise
            # The trainer published two versions since (async): that one is overwritten; serve the newest.
            self.weights.refresh()

    def _checker_replaced(self, why: str) -> None:
        self.info[CHECKER] = self.checker.info
        self.on_event(CHECKER, f"replaced: {why}")

    def _reward_spec(self) -> RewardSpec:
        return RewardSpec(*self._reward_set, self.reward_timeout_s, self.threads)


def _start_mesh(config: Config, placement: Placement) -> LocalMesh:
    """This host's procs, a Slurm job's nodes, or the workers at `mesh.hosts`, placed by `placement`."""
    if config.mesh.kind == "hosts":
        from forge_nb.launch.hosts import HostsMesh

        return HostsMesh(config.mesh.hosts, placement, config.mesh.credentials)
    if config.mesh.kind == "local":
        return LocalMesh(placement)
    mesh = SlurmMesh(config.slurm, placement, slurm_nodes(config))
    mesh.placement = plan(config, hosts_for(config, mesh.names))  # the same plan, named after the job's nodes
    return mesh


def _replica_sampling(sampling: SamplingParams, replica: int) -> SamplingParams:
    """Each replica samples from its own seed stream (replica 0 keeps the session's seed)."""
    if sampling.seed is None or replica == 0:
        return sampling
    return dataclasses.replace(sampling, seed=sampling.seed + 7919 * replica)
