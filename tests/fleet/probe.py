"""An actor to spawn into a proc and ask what that proc sees (tests of where and how procs start)."""

from __future__ import annotations

import os

from monarch.actor import Actor, endpoint


class EnvProbe(Actor):
    """Spawned into a role's proc (directly, or by `LocalMesh.spawn`, which passes a spec): reports what that
    proc sees."""

    def __init__(self, spec: None = None) -> None:
        pass

    @endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)

    @endpoint
    def pid(self) -> int:
        return os.getpid()
