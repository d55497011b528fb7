"""IPython magics: `%forge SUBCOMMAND ...` and the cells `%%forge reward` / `%%forge loss`.

Every subcommand is a one-liner over the `Session` API; the session is the one started last in
this kernel (`%forge up` or `forge_nb.up()` in a cell), and survives cell re-runs.
"""

from __future__ import annotations

import ast

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from forge_nb.config import Config, ConfigError, parse_overrides
from forge_nb.notebook.errors import ForgeMagicError
from forge_nb.runtime import lifecycle
from forge_nb.watch import CONDITIONS

SUBCOMMANDS = (
    "up",
    "attach",
    "detach",
    "ps",
    "status",
    "step",
    "run",
    "pause",
    "resume",
    "stop",
    "sync",
    "samples",
    "dashboard",
    "explore",
    "watch",
    "save",
    "versions",
    "eval",
    "export",
    "endpoint",
    "tinker",
    "down",
)


@magics_class
class ForgeMagics(Magics):
    @line_cell_magic
    def forge(self, line: str, cell: str | None = None):
        """``%forge up [--slurm|--hosts H1,..] [--name N] [--new]|attach [NAME]|detach|ps|status|step N|run [N]|``
        ``pause|resume|stop|sync|samples N [--step S] [--prompt ID]|dashboard|explore|watch NAME=THRESHOLD ...|``
        ``save PATH|versions|eval|export PATH|endpoint|tinker [--host H] [--port P]|down``
        ``%%forge reward [--name NAME] [--weight W] | %%forge loss | %%forge rollout [--tools a,b] | %%forge env``
        (the cell defines the function -- or the environment class; it is
        validated and made live; --name adds or replaces one of several weighted rewards)"""
        command, _, rest = line.strip().partition(" ")
        if cell is not None:
            return self._cell(command, rest, cell)
        if command not in SUBCOMMANDS:
            raise ForgeMagicError(f"%forge {command}: unknown subcommand; use one of {', '.join(SUBCOMMANDS)}")
        return getattr(self, f"_{command}")(rest)

    @magic_arguments()
    @argument("--name", default=None, help="which reward (default: reward); several can be live at once")
    @argument("--weight", type=float, default=None, help="its weight in the trained reward (0: logged only)")
    @argument("--tools", default="", help="rollout: names of the tool functions, comma-separated")
    def _cell(self, kind: str, rest: str, cell: str):
        if kind not in ("reward", "loss", "rollout", "env"):
            raise ForgeMagicError(f"%%forge {kind}: a cell magic is %%forge reward, loss, rollout or env")
        args = parse_argstring(self._cell, rest)
        if kind in ("rollout", "env"):
            return self._agent_cell(kind, cell, [t for t in args.tools.split(",") if t])
        if kind == "loss" and (args.name or args.weight is not None):
            raise ForgeMagicError("%%forge loss takes no --name or --weight (the loss is one function)")
        # The cell runs here first (its function is usable in the kernel too); what travels is that
        # function with what it reads (`live.closure`), or the cell's text if it did not run.
        ran = self.shell.run_cell(cell, store_history=False)
        code = _last_function(cell, self.shell.user_ns) if ran.success else None
        session = _session()
        if kind == "loss":
            print(f"loss v{session.set_loss(code or cell)} is live (from the next batch)")
            return None
        version = session.set_reward(code or cell, name=args.name, weight=args.weight)
        member = session.registry.live("reward").members[args.name or "reward"]
        print(f"reward v{version} is live (from the next batch): {args.name or 'reward'} with weight {member.weight:g}")
        return None

    def _agent_cell(self, kind: str, cell: str, tools: list[str]):
        """%%forge rollout [--tools calculator,search]: the cell's last ``async def`` is the agent loop;
        %%forge env: the cell's last class is the environment. Run here first, then checked and made live."""
        ran = self.shell.run_cell(cell, store_history=False)
        if not ran.success:
            raise ForgeMagicError(f"%%forge {kind}: the cell raised; nothing changed")
        ns = self.shell.user_ns
        missing = [t for t in tools if not callable(ns.get(t))]
        if missing:
            raise ForgeMagicError(f"%%forge {kind}: no function {missing[0]!r} in the notebook for --tools")
        if kind == "env":
            found = _last_function(cell, ns, (ast.ClassDef,))
            version = _session().set_env(found) if found else None
        else:
            found = _last_function(cell, ns)
            version = _session().set_rollout(found, tools=[ns[t] for t in tools]) if found else None
        if version is None:
            raise ForgeMagicError(f"%%forge {kind}: the cell defines no {'class' if kind == 'env' else 'function'}")
        print(f"{kind} v{version} is live (from the next batch)")

    @magic_arguments()
    @argument("overrides", nargs="*", help="config fields, e.g. lr=1e-4 group_size=4")
    @argument("--config", default=None, help="YAML config file")
    @argument("--slurm", action="store_true", help="run the actors in a Slurm job (options: slurm.partition=...)")
    @argument("--hosts", default=None, help="comma-separated tls://HOST:PORT of running forge_nb workers")
    @argument("--credentials", default=None, help="the workers' credentials folder (mesh.credentials)")
    @argument("--name", default=None, help="the session's name (default: the notebook's)")
    @argument("--new", action="store_true", help="start a new session even if this notebook's is running")
    def _up(self, rest: str):
        args = parse_argstring(self._up, rest)
        overrides = parse_overrides(args.overrides) | ({"mesh.kind": "slurm"} if args.slurm else {})
        if args.hosts:
            overrides |= {"mesh.kind": "hosts", "mesh.hosts": [h.strip() for h in args.hosts.split(",") if h.strip()]}
        if args.credentials:
            overrides |= {"mesh.credentials": args.credentials}
        config = (Config.from_yaml(args.config) if args.config else Config()).updated(overrides)
        current = lifecycle.current()
        if current is not None and not args.new and args.name in (None, current.name):
            if current.config == config:
                print(f"forge_nb: session {current.name!r} is already up in this kernel; reusing it")
                return current
            raise ConfigError(
                f"forge_nb: a session with another config is up; run %forge down first ({current.name!r}; "
                "%forge up --new starts another beside it)"
            )
        import forge_nb

        return forge_nb.up(config, name=args.name, new=args.new)  # displayed: what came up (its summary)

    def _attach(self, rest: str):
        """%forge attach [NAME]: the running session NAME (default: this notebook's, or the only one running)."""
        import forge_nb

        name = rest.strip() or None
        session = forge_nb.attach(name)
        run = (session.status().get("run") or {}).get("state")
        print(
            f"forge_nb: attached to session {session.name!r} at step {session.step_count}"
            + (f"; its background run is {run}" if run else "")
        )
        return None

    def _detach(self, rest: str):
        session = lifecycle.current()
        if session is None:
            print("forge_nb: no session is attached in this kernel")
            return
        session.detach()
        print(f"forge_nb: detached; session {session.name!r} goes on (%forge attach {session.name})")

    def _ps(self, rest: str):
        import forge_nb

        return forge_nb.ps()

    def _status(self, rest: str):
        return _session().status()

    def _endpoint(self, rest: str) -> dict:
        """The session's OpenAI-compatible endpoint for agents in other processes (`s.trajectory(row)`)."""
        endpoint = _session().endpoint()
        return {"url": endpoint.url, "api_key": endpoint.api_key, "trajectory": "with s.trajectory(row) as t: ..."}

    @magic_arguments()
    @argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    @argument("--port", type=int, default=0, help="port (default: a free one)")
    def _tinker(self, rest: str) -> dict:
        """The session's Tinker API (`s.serve_tinker()`): what a Tinker script's environment needs."""
        args = parse_argstring(self._tinker, rest)
        endpoint = _session().serve_tinker(args.host, args.port)
        return {"TINKER_BASE_URL": endpoint.url, "TINKER_API_KEY": endpoint.api_key}

    @magic_arguments()
    @argument("steps", nargs="?", type=int, default=None, help="steps (default: until %%forge stop)")
    def _run(self, rest: str):
        steps = parse_argstring(self._run, rest).steps
        _session().run(steps)
        how_long = f"{steps} steps" if steps else "until %forge stop"
        print(f"forge_nb: training in the background ({how_long}), in the session's server; %forge pause / stop")

    def _pause(self, rest: str):
        _session().pause()

    def _resume(self, rest: str):
        _session().resume()

    def _stop(self, rest: str):
        _session().stop()

    def _sync(self, rest: str):
        return _session().sync()

    @magic_arguments()
    @argument("n", nargs="?", type=int, default=16, help="how many recent samples")
    @argument("--step", type=int, default=None, help="every sample of this trained step (the rollout log)")
    @argument("--prompt", default=None, help="every sample of this prompt id so far (the rollout log)")
    def _samples(self, rest: str):
        """Recent samples, one of each recent prompt before a second of any (a group's samples share their prompt:
        the last N in a row would often be N samples of one prompt); every sample of a step or of a prompt."""
        args = parse_argstring(self._samples, rest)
        if args.step is not None or args.prompt is not None:
            return _session().samples(args.n, step=args.step, prompt_id=args.prompt)
        return spread(_session().samples(max(args.n * 16, 64)), args.n)

    @magic_arguments()
    @argument("n", nargs="?", type=int, default=1, help="steps")
    def _step(self, rest: str):
        """N steps -> the columns a person reads first (`s.step(n)` returns every column; `s.metrics` the stream)."""
        table = _session().step(parse_argstring(self._step, rest).n)
        shown = [c for c in STEP_COLUMNS if c in table.columns]
        print(
            f"forge_nb: {len(shown)} of {len(table.columns)} columns (s.step(n) returns all); loss is ~0 on-policy by "
            "construction (group-centred advantages, ratio 1): grad_norm shows the update"
        )
        return table[shown]

    def _dashboard(self, rest: str):
        return _session().dashboard()

    def _explore(self, rest: str):
        return _session().explore()

    @magic_arguments()
    @argument(
        "conditions",
        nargs="*",
        help=f"NAME=THRESHOLD: {', '.join(CONDITIONS)}; or off",
    )
    def _watch(self, rest: str):
        args = parse_argstring(self._watch, rest)
        if args.conditions == ["off"]:
            _session().unwatch()
            print("forge_nb: watch off")
            return None
        return _session().watch(**{k: float(v) for k, v in parse_overrides(args.conditions).items()})

    @magic_arguments()
    @argument("path", help="folder to write the checkpoint to (forge_nb.resume(path) goes on from it)")
    def _save(self, rest: str):
        out = _session().save(parse_argstring(self._save, rest).path)
        print(f"forge_nb: saved to {out}; resume with forge_nb.resume({str(out)!r})")
        return None

    def _versions(self, rest: str):
        return _session().versions()

    def _eval(self, rest: str):
        return _session().evaluate()

    @magic_arguments()
    @argument("path", help="directory to write run.py, run.sbatch, config.yaml, reward.py, loss.py, checkpoint/")
    @argument("--steps", type=int, default=100, help="steps the exported run takes (default 100)")
    def _export(self, rest: str):
        args = parse_argstring(self._export, rest)
        from forge_nb.export import run_hint

        out = _session().export(args.path, args.steps)
        print(f"forge_nb: {run_hint(out)}")
        return out

    def _down(self, rest: str):
        session = lifecycle.current()
        if session is None:
            print("forge_nb: no session is up in this kernel (forge-nb ps lists this user's; %forge attach NAME)")
            return
        session.down()
        print(f"forge_nb: session {session.name!r} is down: every proc stopped, its server too")


def _last_function(cell: str, namespace: dict, kinds: tuple = (ast.FunctionDef, ast.AsyncFunctionDef)):
    """The function (or class, with `kinds`) the cell's last top-level definition bound, as it is in the
    kernel now (None if none)."""
    try:
        names = [n.name for n in ast.parse(cell).body if isinstance(n, kinds)]
    except SyntaxError:
        return None
    fn = namespace.get(names[-1]) if names else None
    return fn if callable(fn) else None


#: What `%forge step` shows: how the reward and the task's accuracy go, what the update did, and how fast.
STEP_COLUMNS = ("mean_reward", "accuracy", "loss", "grad_norm", "entropy", "policy_version", "tokens_per_s", "step_s")


def spread(table, n: int):
    """The `n` most recent rows of `table` (samples, oldest first), taking one row of each recent prompt before a
    second of any -> those rows, oldest first."""
    if table.empty or "prompt" not in table.columns:
        return table.tail(n)
    recent = table.iloc[::-1]
    rank = recent.groupby("prompt", sort=False).cumcount()
    order = recent.assign(_rank=rank.values).reset_index().sort_values("_rank", kind="stable").head(n)
    return table.loc[sorted(order[table.index.name or "index"])]


def _session():
    session = lifecycle.current()
    if session is None:
        raise ForgeMagicError("forge_nb: no session is up; run %forge up first")
    return session


def load_ipython_extension(ipython) -> None:
    from forge_nb.notebook import errors, sidebar

    ipython.register_magics(ForgeMagics)
    errors.register(ipython)  # forge_nb's errors meant for the user: their message, not a traceback through it
    sidebar.register(ipython)  # the JupyterLab sidebar's comm target (a no-op outside a kernel)
