"""The manifest a reader on this host needs from a publisher of the tests: its /dev/shm buffers only (no
RDMA, no TCP stream: `WeightPublisher.manifest` would register and serve those)."""

from __future__ import annotations

from forge_nb.weights.manifest import WeightManifest, host_id
from forge_nb.weights.publish import WeightPublisher


def shm_manifest(p: WeightPublisher) -> WeightManifest:
    return WeightManifest(p.slots, p.nbytes, p.nonce, host_id(), p.chunk_bytes, (), p.shm_paths, None, p.rank, p.ranks)
