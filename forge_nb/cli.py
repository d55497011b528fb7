"""`forge-nb` command line: `demo` runs the default session; `bench NAME` runs benchmarks/NAME.py;
`export PATH` writes a standalone script + sbatch file for a config; `ps` and `down` list and end sessions;
`credentials new|show [DIR]` makes and checks the CA your hosts' workers hold."""

from __future__ import annotations

import argparse
import runpy
import sys
import time
from pathlib import Path

import pandas as pd

from forge_nb.config import Config, ConfigError, parse_overrides

DEMO_COLUMNS = [
    "policy_version",
    "mean_reward",
    "accuracy",
    "tokens_per_s",
    "generate_s",
    "score_s",
    "train_s",
    "refresh_s",
    "refresh_gbps",
    "step_s",
]


def demo(minutes: float, steps: int | None, every: int, config: Config) -> pd.DataFrame:
    """Run the session for `minutes` (or exactly `steps`), print a table row per `every` steps and
    held-out accuracy before and after. Returns the per-step DataFrame."""
    import forge_nb

    started = time.perf_counter()
    with forge_nb.up(config, persist=False) as session:
        print(f"session {session.name!r} up in {time.perf_counter() - started:.1f} s: {session.pids}")
        before = _heldout(session)
        print(f"held-out accuracy before: {before}")
        frames, deadline = [], time.perf_counter() + minutes * 60
        while (steps is None and time.perf_counter() < deadline) or (steps is not None and session.step_count < steps):
            chunk = session.step(every if steps is None else min(every, steps - session.step_count), progress=False)
            frames.append(chunk)
            _print_rows(chunk, header=len(frames) == 1)
        after = _heldout(session)
    table = pd.concat(frames)
    first, last = table.head(every), table.tail(every)
    print(f"held-out accuracy after:  {after}  (before: {before})")
    print(
        f"mean reward, first {len(first)} steps: {first.mean_reward.mean():.3f}; "
        f"last {len(last)} steps: {last.mean_reward.mean():.3f}"
    )
    return table


def _heldout(session) -> str:
    """Held-out accuracy greedy (one answer per problem) and sampled (the trained policy itself, at
    engine.temperature, eval.samples_per_prompt per problem): the sampled one moves first."""
    greedy, sampled = (session.evaluate(greedy=g) for g in (True, False))
    return (
        f"greedy {greedy['heldout_accuracy']:.3f} ± {greedy['heldout_se']:.3f}, sampled"
        f" {sampled['heldout_accuracy']:.3f} ± {sampled['heldout_se']:.3f} (± one standard error over"
        f" {greedy['eval_problems']} problems)"
    )


def _print_rows(chunk: pd.DataFrame, header: bool) -> None:
    """One fixed-width line per chunk of steps: means over the chunk, the last step's version."""
    means = chunk[DEMO_COLUMNS].mean()
    means["policy_version"] = chunk.policy_version.iloc[-1]
    if header:
        print(f"{'steps':>9} " + " ".join(f"{c:>14}" for c in DEMO_COLUMNS))
    cells = [f"{int(v):>14d}" if c == "policy_version" else f"{v:>14.3f}" for c, v in means.items()]
    print(f"{chunk.index[0]:>4}-{chunk.index[-1]:<4} " + " ".join(cells), flush=True)


def benchmarks_dir() -> Path | None:
    """benchmarks/ of the source checkout this package runs from, else of the working directory."""
    for root in (Path(__file__).resolve().parent.parent, Path.cwd()):
        if (root / "benchmarks").is_dir() and (root / "forge_nb").is_dir():
            return root / "benchmarks"
    return None


def bench(name: str, args: list[str]) -> None:
    folder = benchmarks_dir()
    if folder is None:
        raise SystemExit(
            "forge-nb bench: the benchmarks ship with the source, not the installed package; run it from a "
            "checkout of forge_nb (git clone, then `pip install -e .` and `forge-nb bench NAME` there)"
        )
    script = folder / f"{name}.py"
    if not script.is_file():
        known = sorted(p.stem for p in folder.glob("*.py"))
        raise SystemExit(f"forge-nb bench: no benchmark {name!r}; known: {known}")
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(folder))  # as `python benchmarks/NAME.py` has it: a benchmark imports its siblings
    runpy.run_path(str(script), run_name="__main__")


def sessions(args: argparse.Namespace) -> None:
    """forge-nb ps / forge-nb down NAME... | --all."""
    from forge_nb.server import start

    if args.command == "ps":
        table = start.ps()
        with pd.option_context("display.width", 200, "display.max_colwidth", 60):
            print(table.to_string() if len(table) else "forge-nb: no sessions")
        return
    if not args.names and not args.all:
        raise SystemExit("forge-nb down: name the sessions (forge-nb ps lists them) or say --all")
    for line in start.down(None if args.all else args.names):
        print(f"forge-nb: {line}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="forge-nb", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run the default session on the local mesh and print a per-step table")
    d.add_argument("--minutes", type=float, default=3.0, help="time budget (default 3)")
    d.add_argument("--steps", type=int, default=None, help="run exactly this many steps instead")
    d.add_argument("--every", type=int, default=25, help="print one row per this many steps")
    d.add_argument("--config", type=Path, default=None, help="YAML config file")
    d.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="override fields, e.g. lr=1e-4")
    e = sub.add_parser("export", help="write run.py + run.sbatch that run a config without a notebook")
    e.add_argument("path", type=Path)
    e.add_argument("--steps", type=int, default=100, help="steps the exported run takes (default 100)")
    e.add_argument("--config", type=Path, default=None, help="YAML config file")
    e.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="override fields, e.g. lr=1e-4")
    b = sub.add_parser("bench", help="run benchmarks/NAME.py")
    b.add_argument("name")
    b.add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("ps", help="this user's sessions: name, state, model, mesh, step, versions, clients, age")
    dn = sub.add_parser("down", help="end sessions (every proc and the server) and clear those gone")
    dn.add_argument("names", nargs="*", help="session names (see forge-nb ps)")
    dn.add_argument("--all", action="store_true", help="every session of this user, and the zygotes that fork servers")
    sub.add_parser(
        "credentials", add_help=False, help="make (new) or check (show) the CA of your hosts' workers: --help says more"
    )
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["credentials"]:
        from forge_nb.launch.credentials import main as credentials

        raise SystemExit(credentials(argv[1:]))
    args = parser.parse_args(argv)
    if args.command == "bench":
        return bench(args.name, args.args)
    if args.command in ("ps", "down"):
        return sessions(args)
    try:
        config = (Config.from_yaml(args.config) if args.config else Config()).updated(parse_overrides(args.set))
    except ConfigError as e:
        raise SystemExit(f"forge-nb: {e}") from None
    if args.command == "export":
        from forge_nb.export import export_config, run_hint

        print(f"forge-nb: {run_hint(export_config(config, args.path, args.steps))}")
        return None
    pd.set_option("display.width", 200)
    demo(args.minutes, args.steps, args.every, config)


if __name__ == "__main__":
    main()
