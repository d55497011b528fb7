"""The session a notebook holds: `Session` plus its widgets, which close when it goes down.

`forge_nb.up()`, `forge_nb.resume()` and `%forge up` return this class; a script gets the same
object and never pays for a widget it does not draw (each view imports its widgets when asked).
The controller (`forge_nb.session`) knows nothing of notebooks: the views observe it (its metrics
stream and state) and are kept here so `down()` can close them.
"""

from __future__ import annotations

from typing import Any

from forge_nb.session import Session


class NotebookSession(Session):
    """A `Session` with live views: `dashboard()` and `explore()`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._views: list = []  # open dashboards, closed by `down`

    def dashboard(self):
        """A live ipywidgets dashboard of this session (display it, or let the cell return it)."""
        from forge_nb.notebook.dashboard import Dashboard

        board = Dashboard(self)
        self._views.append(board)
        return board.widget

    def explore(self):
        """The sample explorer widget: a step's groups, a sample's tokens, pinned prompts, the live generator."""
        from forge_nb.notebook.explorer import Explorer

        return Explorer(self).widget

    def down(self) -> None:
        for view in self._views:
            view.close()
        self._views.clear()
        super().down()
