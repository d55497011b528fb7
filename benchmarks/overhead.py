"""Mesh overhead: the same GRPO step in a plain single-process loop and through forge_nb's mesh.

Both sides do identical work per step -- generate P x G samples with the torch engine, score them
with the task verifier, group-relative advantages, one GRPO optimizer step (both run each prompt once
for its group and leave the zero-advantage rows out of the forward/backward), copy the new weights into
the generator -- on the bundled model, with the same seeds and torch thread budget. The plain
loop copies weights with a memcpy; the mesh's generator copies them from the trainer's /dev/shm snapshot. The mesh's
rollout log (every sample written to Parquet, which the plain loop does not do) is off unless `--log`.
Blocks of steps alternate between the two so machine noise hits both alike.

Then the floor: the four messages of a mesh step (generate, score, train, refresh) with the payloads of
the run's last step, back to back, to actors in their own procs that answer at once. No mesh step can
cost less than the plain step plus this. With ``--over tcp tls`` the same four messages also go, from a fresh
process each, to procs of a worker on this machine's loopback, as a hosts session's do: over plain TCP (Monarch's
own worker, which trusts any caller: what forge_nb's worker was before #59) and over mutual TLS (forge_nb's worker
and the session's certificate): what TLS costs a step's messages.

Last, the session server: the same session config runs twice, its controller in this process (`Session.up`,
the mesh column above) and in a server of its own with this process as its client (`forge_nb.up`), blocks
interleaved: the wall time a step takes as the caller sees it, for the client calling `step(1)` each step (a
round trip a step) and `step(n)` once a block; and the time a new process takes to attach to the running
session (`forge_nb.attach`), alone and with the interpreter's start and imports.

    python benchmarks/overhead.py [--steps-per-block 25] [--blocks 4] [--over tcp tls]
"""

from __future__ import annotations

import argparse
import functools
import os
import pickle
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from monarch.actor import Actor, endpoint
from transformers import AutoModelForCausalLM

import forge_nb
from forge_nb.actors.generator import Generation
from forge_nb.actors.trainer import TrainResult
from forge_nb.config import Config
from forge_nb.engines.torch_engine import TorchEngine
from forge_nb.launch.local import LocalMesh
from forge_nb.live.builtin import builtin_loss
from forge_nb.rewards.batch import Scores
from forge_nb.rl.advantages import group_relative
from forge_nb.rl.batch import TrainBatch
from forge_nb.rl.losses import grpo_loss
from forge_nb.rl.prefix_batch import collate_prefix
from forge_nb.rl.update import UpdateOptions, policy_update
from forge_nb.session import Session
from forge_nb.step import reward_batch
from forge_nb.tasks import make_task
from forge_nb.weights.refresh import RefreshReport


class PlainLoop:
    """The whole GRPO step in one process, no actors: the baseline the mesh must match."""

    def __init__(self, config: Config) -> None:
        path = config.model.resolved_path()
        self.config = config
        self.engine = TorchEngine.load(path)
        self.model = AutoModelForCausalLM.from_pretrained(str(path))
        a = config.algorithm
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=a.lr, weight_decay=0.0)
        self.loss_fn = functools.partial(grpo_loss, clip_eps=a.clip_eps, token_level=a.token_level)
        # The mesh's trainer leaves zero-advantage rows out of its forward/backward with this loss; so does
        # this loop, so that the ratio measures orchestration only.
        self.skip_zero_advantage = builtin_loss(a, config.engine.max_tokens).zero_advantage_inert
        self.task = make_task(config.task, config.seed + 1)
        self.steps = 0

    def step(self, sampling) -> dict[str, float]:
        a, times = self.config.algorithm, {}
        t0 = time.perf_counter()
        problems = self.task.sample(a.prompts_per_step)
        completions = self.engine.generate([p.prompt for p in problems], sampling)
        self.last = problems, completions
        t1 = time.perf_counter()
        flat = [c for group in completions for c in group]
        targets = [p.target for p in problems for _ in range(sampling.n)]
        rewards = [self.task.verify(c.text, t) for c, t in zip(flat, targets)]
        grouped = torch.tensor(rewards).view(len(problems), sampling.n)
        adv = group_relative(grouped, a.normalize_std, unbiased=a.group_std == "sample").flatten()
        t2 = time.perf_counter()
        batch = collate_prefix(  # as the mesh's trainer: each prompt runs once for its group
            [c.prompt_ids for c in flat],
            [c.token_ids for c in flat],
            self.engine.pad_id,
            [c.logprobs for c in flat],
            adv.tolist(),
        )
        options = UpdateOptions(sampling.temperature, a.max_grad_norm, skip_zero_advantage=self.skip_zero_advantage)
        policy_update(self.model, self.optimizer, batch, self.loss_fn, options)
        t3 = time.perf_counter()
        self.engine.load_weights(self.model.named_parameters())
        t4 = time.perf_counter()
        self.steps += 1
        times.update(generate_s=t1 - t0, score_s=t2 - t1, train_s=t3 - t2, refresh_s=t4 - t3, step_s=t4 - t0)
        return times


class Answers(Actor):
    """Answers each call at once with the reply it was given for that endpoint (the floor's reward, trainer)."""

    def __init__(self, spec: dict) -> None:
        self.replies = spec

    @endpoint
    def call(self, *args: object) -> object:
        return self.replies["call"]


class AsyncAnswers(Actor):
    """`Answers` with async endpoints, as the generator has: `call` (generate) and `refresh`."""

    def __init__(self, spec: dict) -> None:
        self.replies = spec

    @endpoint
    async def call(self, *args: object) -> object:
        return self.replies["call"]

    @endpoint
    async def refresh(self, *args: object) -> object:
        return self.replies["refresh"]


def floor_payloads(session, plain: PlainLoop) -> dict:
    """What the step's four messages carry in the run's last step, and what each actor answers."""
    problems, completions = plain.last
    episodes = session.state.buffer.recent(sum(len(group) for group in completions))
    ids, sampling = session.state.prompts.render_all(problems)[1], session.state.sampling()
    batch, rewards = TrainBatch.of(episodes), reward_batch(episodes, session.state.step_count)
    scores = Scores([e.reward for e in episodes], components={"reward": [e.reward for e in episodes]})
    return {
        "generate": (ids, sampling),
        "score": (rewards,),
        "train": (batch,),
        "generation": Generation(completions, 0, 0.0),
        "scores": scores,
        "result": TrainResult(1, 0, {"loss": 0.0, "grad_norm": 0.0}, 0.0, 0.0),
        "report": RefreshReport(1, 0, 0, 0.0, 0.0, False, "shm"),
    }


def four_messages(spawn, payloads: dict, steps: int) -> list[float]:
    """Seconds per step of the four messages, back to back, to actors `spawn(role, class, spec)` starts."""
    p = payloads
    generator = spawn("generator", AsyncAnswers, {"call": p["generation"], "refresh": p["report"]})
    reward = spawn("reward", Answers, {"call": p["scores"]})
    trainer = spawn("trainer", Answers, {"call": p["result"]})
    calls = [(generator.call, p["generate"]), (reward.call, p["score"]), (trainer.call, p["train"])]
    calls.append((generator.refresh, (1,)))
    seconds = []
    for _ in range(steps + 5):
        start = time.perf_counter()
        for call, args in calls:
            call.call_one(*args).get()
        seconds.append(time.perf_counter() - start)
    return seconds[5:]


def floor(session, plain: PlainLoop, steps: int) -> list[float]:
    """Seconds per step of the mesh step's four messages alone, with the last step's payloads."""
    mesh = LocalMesh()
    try:
        return four_messages(mesh.spawn, floor_payloads(session, plain), steps)
    finally:
        mesh.stop()


def floor_over(transport: str, payloads: dict, steps: int) -> list[float]:
    """`floor`'s messages to procs of a worker on this machine's loopback, over `transport` ("tcp" or "tls"),
    in a fresh process (its Monarch's first use)."""
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "payloads.pkl"
        data.write_bytes(pickle.dumps(payloads))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), str(Path(__file__).parent)]),
        }
        done = subprocess.run(
            [sys.executable, __file__, "--floor-over", transport, str(data), str(steps)],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the floor over {transport} failed:\n{done.stderr[-3000:]}")
        return [float(x) for x in done.stdout.split()[-steps:]]


def _floor_over_main(transport: str, data: str, steps: int) -> None:
    """The child of `floor_over`: a worker on the loopback, attached over `transport`; prints the seconds."""
    from monarch.actor import attach_to_workers, enable_transport

    from forge_nb.launch.credentials import Credentials

    payloads = pickle.loads(Path(data).read_bytes())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder = Path(data).parent / "credentials"
    if transport == "tls":
        credentials = Credentials.new(folder)
        worker = [
            sys.executable,
            "-m",
            "forge_nb.launch.worker",
            f"tls://127.0.0.1:{port}",
            "--credentials",
            str(folder),
        ]
        credentials.use("127.0.0.1")
    else:  # Monarch's own worker, as forge_nb's was before #59
        loop = f"run_worker_loop_forever(address='tcp://127.0.0.1:{port}', ca='trust_all_connections')"
        worker = [sys.executable, "-c", f"from monarch.actor import run_worker_loop_forever; {loop}"]
    process = subprocess.Popen(worker, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        enable_transport(f"{transport}://127.0.0.1:0")
        hosts = attach_to_workers(ca="trust_all_connections", workers=[f"{transport}://127.0.0.1:{port}"])
        hosts.initialized.get(timeout=120)

        def spawn(role: str, actor_class: type, spec: dict):
            return hosts.spawn_procs(per_host={"procs": 1}, name=role).spawn(role, actor_class, spec)

        seconds = four_messages(spawn, payloads, steps)
        print(" ".join(f"{x:.6f}" for x in seconds), flush=True)
    finally:
        process.kill()
        process.wait()
    os._exit(0)  # the procs go with their worker; Monarch's threads would keep dialling it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps-per-block", type=int, default=25)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch threads, per process on both sides")
    parser.add_argument(
        "--log", action="store_true", help="keep the mesh's rollout log on (every sample to Parquet, in the kernel)"
    )
    parser.add_argument("--over", nargs="*", default=[], choices=("tcp", "tls"), help="the floor over a worker too")
    parser.add_argument("--floor-over", nargs=3, help=argparse.SUPPRESS)  # floor_over's child
    args = parser.parse_args()
    if args.floor_over:
        transport, data, steps = args.floor_over
        return _floor_over_main(transport, data, int(steps))

    config = Config().updated({"threads_per_proc": args.threads, "engine.name": "torch", "log.samples": args.log})
    torch.set_num_threads(args.threads)
    plain = PlainLoop(config)
    session = Session.up(config)  # the controller in this process
    client = forge_nb.up(config, name=f"overhead-{os.getpid()}", persist=False)  # the same, in its server
    try:
        plain_rows, mesh_rows, walls = [], [], {"in process": [], "client, step(1)": [], "client, step(n)": []}
        for _ in range(args.warmup):
            plain.step(session.state.sampling())
        session.step(args.warmup, progress=False)
        client.step(args.warmup, progress=False)
        n = args.steps_per_block
        for _ in range(args.blocks):
            plain_rows += [plain.step(session.state.sampling()) for _ in range(n)]
            start = time.perf_counter()
            mesh_rows += session.step(n, progress=False).to_dict("records")
            walls["in process"].append((time.perf_counter() - start) / n)
            start = time.perf_counter()
            for _ in range(n):
                client.step(1, progress=False)
            walls["client, step(1)"].append((time.perf_counter() - start) / n)
            start = time.perf_counter()
            client.step(n, progress=False)
            walls["client, step(n)"].append((time.perf_counter() - start) / n)
        floor_s = floor(session, plain, len(mesh_rows))
        over = {t: floor_over(t, floor_payloads(session, plain), len(mesh_rows)) for t in args.over}
        attach = attach_times(client.name)
    finally:
        session.down()
        client.down()
    report(plain_rows, mesh_rows, config, floor_s)
    report_client(walls, n, attach)
    report_over(floor_s, over)


def attach_times(name: str, runs: int = 3) -> dict[str, list[float]]:
    """Seconds to attach to the running session `name` from a new process: `forge_nb.attach` alone (the
    process has imported forge_nb), and the whole of a fresh interpreter's import + attach + first status."""
    code = (
        "import time; t0 = time.perf_counter(); import forge_nb; t1 = time.perf_counter(); "
        f"s = forge_nb.attach({name!r}); s.status(); t2 = time.perf_counter(); s.detach(); "
        "print(t2 - t1, t2 - t0)"
    )
    out: dict[str, list[float]] = {"attach": [], "import + attach": []}
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        alone, whole = (float(x) for x in done.stdout.split()[-2:])
        out["attach"].append(alone)
        out["import + attach"].append(whole)
    return out


def report_over(local: list[float], over: dict[str, list[float]]) -> None:
    """The floor on this host's Unix sockets and through a loopback worker over each transport."""
    if not over:
        return
    print("\nthe step's four messages (the floor), ms a step, to procs of:")
    rows = {"this host (Unix sockets)": local, **{f"a worker over {t}": v for t, v in over.items()}}
    for label, values in rows.items():
        median, mean = statistics.median(values) * 1e3, statistics.fmean(values) * 1e3
        p90 = statistics.quantiles(values, n=10)[-1] * 1e3
        print(f"  {label:<26}median {median:>7.2f}  mean {mean:>7.2f}  p90 {p90:>7.2f}  ({len(values)} steps)")
    if {"tcp", "tls"} <= set(over):
        tcp, tls = (statistics.median(over[t]) for t in ("tcp", "tls"))
        print(f"  tls / tcp (medians): {tls / tcp:.3f}x")


def report_client(walls: dict[str, list[float]], n: int, attach: dict[str, list[float]]) -> None:
    """The same steps from a client of the session's server against the controller in the process."""
    base = statistics.fmean(walls["in process"])
    blocks = len(walls["in process"])
    print(f"\nthe same session's steps, wall time a step as the caller sees it (mean of {blocks} blocks of {n}):")
    for label, values in walls.items():
        print(f"  {label:<18}{statistics.fmean(values) * 1e3:>9.2f} ms  {statistics.fmean(values) / base:>6.3f}x")
    for label, values in attach.items():
        print(f"  {label:<18}{statistics.median(values):>9.3f} s (median of {len(values)}; max {max(values):.3f} s)")


def report(plain_rows: list[dict], mesh_rows: list[dict], config: Config, floor_s: list[float]) -> None:
    a = config.algorithm
    print(
        f"\nGRPO step, bundled model, {a.prompts_per_step} prompts x {a.group_size} samples, "
        f"{config.engine.max_tokens} max new tokens, {config.mesh.threads_per_proc} torch threads per process; "
        f"mesh rollout log {'on' if config.log.samples else 'off (the plain loop keeps none; --log turns it on)'}; "
        f"{len(plain_rows)} steps each side, interleaved blocks\n"
    )
    print(f"{'phase (median s)':<18}{'plain loop':>12}{'forge_nb mesh':>15}{'ratio':>8}")
    for phase in ("generate_s", "score_s", "train_s", "refresh_s", "step_s"):
        p = statistics.median(r[phase] for r in plain_rows)
        m = statistics.median(r[phase] for r in mesh_rows)
        print(f"{phase:<18}{p:>12.4f}{m:>15.4f}{m / p:>8.2f}x")
    p_mean = statistics.fmean(r["step_s"] for r in plain_rows)
    m_mean = statistics.fmean(r["step_s"] for r in mesh_rows)
    print(f"{'step_s (mean)':<18}{p_mean:>12.4f}{m_mean:>15.4f}{m_mean / p_mean:>8.2f}x")
    print(f"\nmesh / plain step time: {m_mean / p_mean:.3f}x (goal <= 1.10x)")
    f_median, f_mean = statistics.median(floor_s), statistics.fmean(floor_s)
    print(
        f"floor: the step's four messages alone, back to back, {f_median * 1e3:.2f} ms median "
        f"({f_mean * 1e3:.2f} mean) a step: at best (plain + floor) / plain = {(p_mean + f_mean) / p_mean:.3f}x"
    )


if __name__ == "__main__":
    main()
