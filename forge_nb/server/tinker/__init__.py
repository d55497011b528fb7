"""The Tinker API (the `tinker` SDK's REST protocol, 0.38) served by a session on its own mesh: Tinker code runs
unchanged against the session's trainer gang and generator replicas, and the notebook watches it as its own run.

    endpoint = s.serve_tinker()    # on the session, in process or through its server; %forge tinker
    TINKER_BASE_URL=endpoint.url TINKER_API_KEY=endpoint.api_key python train.py

`endpoint` (the HTTP server and its key), `routes` (the REST paths), `service` (the API's state: client sessions,
the model, sampling sessions, idempotent requests), `queues` (the futures' work, batched), `mesh` (the calls on the
session and the rows the notebook sees), `wire` (the protobuf bodies), `checkpoints`, `futures`. The losses are
`forge_nb.rl.tinker_losses`; docs/guides/tinker.md says what is served and what is not.
"""

from forge_nb.server.tinker.endpoint import TinkerEndpoint

__all__ = ["TinkerEndpoint"]
