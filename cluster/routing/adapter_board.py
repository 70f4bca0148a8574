"""Adapters registered at run time, shared by every router of a deployment through Ray's GCS.

``POST /admin/adapters`` reaches one router; every router must serve the adapter. Like the tenancy
version (``tenancy_board.py``) the registration lives in the GCS key-value store, under the
deployment's generation: it outlives any router, and a router started later (autoscaling) reads it
first. One key per adapter, so two registrations on two routers never overwrite each other.
"""

from __future__ import annotations

import json

from ray.experimental import internal_kv

from cluster.routing.adapter_registry import Adapter

NAMESPACE = "fairlane"


def _key(app: str, generation: str, name: str = "") -> bytes:
    return ":".join(("adapters", app, generation, name)).encode()


def register(app: str, generation: str, adapter: Adapter) -> None:
    value = json.dumps({"model": adapter.model, "path": adapter.path}).encode()
    internal_kv._internal_kv_put(_key(app, generation, adapter.name), value, namespace=NAMESPACE)


def unregister(app: str, generation: str, name: str) -> bool:
    """True when the adapter was registered."""
    return bool(internal_kv._internal_kv_del(_key(app, generation, name), namespace=NAMESPACE))


def registered(app: str, generation: str) -> list[Adapter]:
    """Every adapter registered at run time in this deployment."""
    prefix = _key(app, generation)
    out = []
    for key in internal_kv._internal_kv_list(prefix, namespace=NAMESPACE):
        value = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
        if value is None:  # removed between the list and the read
            continue
        entry = json.loads(value)
        out.append(Adapter(key[len(prefix) :].decode(), entry["model"], entry["path"], source="admin"))
    return out
