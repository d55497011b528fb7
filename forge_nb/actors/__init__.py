"""Monarch actors: thin adapters that hold state and call the plain-PyTorch modules.

Each actor takes one frozen spec (built from `Config` in the kernel, spawned as ``spec=...``) and
its endpoints return dataclasses. `base` has what every actor shares: the proc set-up and the
`ready` endpoint the session waits on.
"""
