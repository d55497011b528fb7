"""TextArena (PyPI ``textarena``, ``pip install 'forge_nb[agents]'``) single-player games as environments.

``env=lambda: TextArenaEnv("GuessTheNumber-v0-raw")`` runs TextArena's own game code unchanged through
`run_rollouts`. ``reset(row)`` makes the game (`textarena.make`) and resets it for one player with the
row's "seed"; ``step(reply)`` passes the model's reply to the game as its action. While the game goes
on the observation is the game's new messages and the reward 0; when it ends, the reward is the
game's own (``env.close()``) and the observation its reason.

The ``-raw`` ids (no TextArena wrappers) suit a chat: each observation holds only the new messages,
since the conversation keeps the history. A wrapped id (e.g. ``"GuessTheNumber-v0"``) works too, but
its wrapper repeats the whole history in every observation. TextArena seeds Python's global `random`
when a seed is given (``random.seed(seed)`` in its `State`).
"""

from __future__ import annotations

from typing import Any


class TextArenaEnv:
    """One TextArena game for one trajectory; `env_id` and `make_kwargs` go to ``textarena.make``."""

    def __init__(self, env_id: str = "GuessTheNumber-v0-raw", **make_kwargs: Any) -> None:
        self.env_id, self.make_kwargs = env_id, make_kwargs
        self.game: Any = None
        self.game_info: dict = {}

    def reset(self, row: dict) -> str:
        try:
            import textarena
        except ImportError as e:
            raise ImportError("TextArenaEnv needs textarena: pip install 'forge_nb[agents]'") from e
        self.game = textarena.make(self.env_id, **self.make_kwargs)
        seed = row.get("seed")
        self.game.reset(num_players=1, seed=None if seed is None else int(seed))
        return self._observe()

    def step(self, action: str) -> tuple[str, float, bool]:
        done, _ = self.game.step(action)
        if not done:
            return self._observe(), 0.0, False
        rewards, game_info = self.game.close()
        self.game_info = game_info.get(0, {})
        return str(self.game_info.get("reason", "The game is over.")), float(rewards[0]), True

    def _observe(self) -> str:
        """The current player's new observation as text (the echo of its own action left out)."""
        import textarena

        _, observation = self.game.get_observation()
        if isinstance(observation, str):
            return observation
        action = textarena.ObservationType.PLAYER_ACTION
        return "\n".join(message for _, message, kind in observation if kind != action)
