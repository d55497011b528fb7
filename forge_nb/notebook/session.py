"""The session a notebook (or a script) holds: a client of the session's server, plus its widgets, which close when
the session goes down or this client detaches.

`forge_nb.up()`, `forge_nb.attach()`, `forge_nb.resume()` and `%forge up` return this class; a script gets the
same object and never pays for a widget it does not draw (each view imports its widgets when asked). The views
observe the session through the client (its mirrored metrics stream and its status).
"""

from __future__ import annotations

from typing import Any

from forge_nb.server.client import SessionClient


class NotebookSession(SessionClient):
    """A `SessionClient` with live views: `dashboard()` and `explore()`; displayed, it says what is up."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._views: list = []  # open dashboards, closed by `down` and `detach`

    def dashboard(self):
        """A live ipywidgets dashboard of this session (display it, or let the cell return it); it draws the
        session's history first, then every new step."""
        from forge_nb.notebook.dashboard import Dashboard

        board = Dashboard(self)
        self._views.append(board)
        return board.widget

    def explore(self):
        """The sample explorer widget: a step's groups, a sample's tokens, pinned prompts, the live generator."""
        from forge_nb.notebook.explorer import Explorer

        return Explorer(self).widget

    def detach(self) -> None:
        for view in self._views:
            view.close()
        self._views.clear()
        super().detach()

    def summary(self) -> dict[str, Any]:
        """What is up, in a few words: the session's name, model, task, engine, mesh and its procs, step and
        versions, background run, clients attached, and when it ends itself."""
        status = self.status()
        procs = status.get("procs", {})
        policy = status.get("policy_version", {})
        idle = self.config.session.idle_timeout_s
        return {
            "session": self.name,
            "model": status.get("model"),
            "task": self.config.task.name,
            "engine": status.get("engine"),
            "mesh": f"{status.get('mesh')}: " + ", ".join(f"{role} {len(p)}" for role, p in procs.items()),
            "step": status.get("steps", 0),
            "versions": f"policy v{policy.get('trainer', 0)}, reward v{status.get('reward_version')}, "
            f"loss v{status.get('loss_version')}",
            "run": (status.get("run") or {}).get("state", "none"),
            "ends": f"after {idle / 60:g} min with no client and nothing running (session.idle_timeout_s)"
            if idle
            else "on down only",
        }

    def _repr_html_(self) -> str:
        import html

        try:
            rows = self.summary()
        except Exception as e:
            return f"<b>forge_nb session {html.escape(self.name)}</b>: {html.escape(str(e))}"
        body = "".join(
            f"<tr><th style='text-align:left'>{k}</th><td style='text-align:left'>{html.escape(str(v))}</td></tr>"
            for k, v in rows.items()
        )
        return f"<table>{body}</table>"

    def __repr__(self) -> str:
        if self._closed:
            return f"<forge_nb session {self.name!r} (detached)>"
        try:
            rows = self.summary()
        except Exception:
            return super().__repr__()
        return "\n".join(f"{k:>9}: {v}" for k, v in rows.items())
