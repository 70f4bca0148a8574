"""Every replica's load, published by the replica itself in Ray's GCS key-value store.

The routers' monitor asks one replica per poll, through Serve's request router, which prefers the
idle replica: a replica that holds KV blocks is the one those polls reach least, so the routers'
last reading of it can be stale. Each replica writes its own load here every second
(``ReplicaServer``), so a check of what every replica holds (``/admin/state`` ``replica_loads``,
``fairlane chaos soak``) reads each live replica. Keys carry the deployment's generation (as the
tenancy version's do, ``cluster/routing/tenancy_board.py``); a replica that stops takes its key with it,
and a killed one's goes stale and is not read.
"""

from __future__ import annotations

import json
import time

from ray.experimental import internal_kv

NAMESPACE = "fairlane"
PUBLISH_EVERY_S = 1.0
FRESH_S = 5.0  # a load older than this is a replica that stopped publishing (killed)


def _key(generation: str, replica_id: str = "") -> bytes:
    return f"replica_load:{generation}:{replica_id}".encode()


def publish(generation: str, replica_id: str, load: dict) -> None:
    value = json.dumps(load | {"published_at": time.time()}).encode()
    internal_kv._internal_kv_put(_key(generation, replica_id), value, namespace=NAMESPACE)


def fresh_loads(generation: str, max_age_s: float = FRESH_S) -> dict[str, dict]:
    """Replica id -> its load, for replicas that published within ``max_age_s``."""
    out: dict[str, dict] = {}
    now = time.time()
    for key in internal_kv._internal_kv_list(_key(generation), namespace=NAMESPACE):
        value = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
        if value is None:
            continue
        load = json.loads(value)
        if now - load["published_at"] <= max_age_s:
            out[key.decode().rsplit(":", 1)[1]] = load
    return out


def forget(generation: str, replica_id: str) -> None:
    internal_kv._internal_kv_del(_key(generation, replica_id), namespace=NAMESPACE)
