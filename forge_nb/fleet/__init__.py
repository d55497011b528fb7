"""The session's actors as one object (`fleet.Fleet`): spawning them, every call on them, supervision and recovery
(`recovery`), weight attach and refresh (`weight_sync`), the live-code checker, judge actors and env procs."""
