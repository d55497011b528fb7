"""Fork servers: an optional start-up optimisation for procs on hosts without GPUs.

A proc started as a fresh interpreter imports torch and transformers (~4 s of CPU for the generator, the trainer
and the reference each); on a laptop's or a CI machine's two cores those imports are most of `up()`. A fork server
imports them once and forks every proc of the session from there (`server`); Monarch still starts each proc and
supervises it, through a small client that hands its environment and descriptors to the server (`client`). A host
worker runs a server of its own for the procs it starts (`on_workers`), and a session server forks its session's
fork server from itself, before it starts Monarch, since it imports torch and transformers anyway (`early`). A GPU
proc always starts fresh: it must initialise CUDA under its own ``CUDA_VISIBLE_DEVICES``, and there loading the
model dominates.

``FORGE_NB_FORK_PROCS=0`` turns it off; ``FORGE_NB_FORK_LINGER_S`` keeps a session's server that many seconds after
`down` for the process's next session. What it saves is measured by ``forge-nb bench session_start`` (and
``session_start_hosts``, ``session_start --server``); the numbers are on the benchmarks page.
"""
