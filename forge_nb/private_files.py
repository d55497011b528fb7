"""Files only this user can read: a session's key (`server.registry`), the mesh's CA key (`launch.credentials`)."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, data: bytes) -> None:
    """`data` into a new file only this user can read (created 0600, never readable by others for an instant)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
