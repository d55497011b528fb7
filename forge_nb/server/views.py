"""Small views a client shows of things that live in the session's server: a watch, the agents' endpoint, an
open trajectory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forge_nb.server.client import SessionClient


@dataclass
class EndpointView:
    """The session's OpenAI-compatible endpoint: its base URL and the token every request must carry."""

    url: str
    api_key: str


@dataclass
class TinkerView:
    """The session's Tinker API: its base URL (``TINKER_BASE_URL``) and the ``tml-`` key every request carries
    (``TINKER_API_KEY``; not in the repr, which a log may keep)."""

    url: str
    api_key: str = field(repr=False)

    def env(self) -> dict[str, str]:
        """What a script's environment needs for ``tinker.ServiceClient()`` to reach the session."""
        return {"TINKER_BASE_URL": self.url, "TINKER_API_KEY": self.api_key}


@dataclass
class TrajectoryView:
    """An open trajectory for an outside agent: its `base_url` and `api_key`; `reward(x)` sets its reward (sent
    when the `with` block ends)."""

    id: str
    base_url: str
    api_key: str
    given_reward: float | None = field(default=None, repr=False)

    def reward(self, value: float) -> None:
        self.given_reward = float(value)


class WatchView:
    """A watch set in the server: the conditions, and what fired so far (`fired`, read from the server). Displayed,
    it shows the conditions, then each firing as the session's metrics stream reports it."""

    def __init__(self, client: SessionClient, thresholds: dict[str, float], when: bool) -> None:
        self._client, self.thresholds, self.when = client, thresholds, when
        self._output: Any = None

    @property
    def fired(self) -> list:
        return self._client._call("watch_fired")

    def widget(self):
        import ipywidgets as widgets

        if self._output is None:
            self._output = widgets.Output()
            watched = ", ".join(f"{k} {v:g}" for k, v in self.thresholds.items())
            self._output.append_stdout(f"forge_nb watch: {watched}{' + predicate' if self.when else ''}\n")
            self._client.metrics_stream.subscribe(self._on_row)
        return self._output

    def _on_row(self, row: dict[str, Any]) -> None:
        if row.get("kind") == "watch" and self._output is not None:
            self._output.append_stdout(
                f"forge_nb watch fired at step {row['step']}: {row['condition']}: {row['message']}; the run is paused\n"
            )

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())

    def __repr__(self) -> str:
        watched = ", ".join(f"{k}={v:g}" for k, v in self.thresholds.items())
        return f"<watch {watched}{' + predicate' if self.when else ''}>"
