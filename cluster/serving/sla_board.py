"""Where the SLA policy's inputs and its decision are published, in Ray's GCS key-value store.

* Each router writes, per model on the SLA policy, its class loads (``sla_router_signals.py``) every
  monitor poll; each of that model's replicas reads the fresh ones in its Serve autoscaling hook and
  reports them with its own (``sla_replica_stats.py``), so they reach the policy in Serve's
  controller the way the engines' counts reach ``engine_load_policy``.
* The policy (``sla_serve_policy.py``) writes its last decision, predictions and the replicas' start
  times; routers read it for ``/admin/state``, Prometheus and the SLA report.

Keys carry the app and the replica deployment's name; stale entries (a stopped router) age out.
"""

from __future__ import annotations

import json
import time

from ray.experimental import internal_kv

NAMESPACE = "fairlane"
FRESH_S = 5.0  # router signals older than this are from a router that stopped


def _signals_key(app: str, deployment: str, router_id: str = "") -> bytes:
    return f"sla_signals:{app}:{deployment}:{router_id}".encode()


def _decision_key(app: str, deployment: str) -> bytes:
    return f"sla_decision:{app}:{deployment}".encode()


def publish_signals(app: str, deployment: str, router_id: str, signals: dict) -> None:
    value = json.dumps(signals | {"published_at": time.time()}).encode()
    internal_kv._internal_kv_put(_signals_key(app, deployment, router_id), value, namespace=NAMESPACE)


def fresh_signals(app: str, deployment: str, max_age_s: float = FRESH_S) -> list[dict]:
    """Every router's latest signals for the deployment, if published within ``max_age_s``."""
    out, now = [], time.time()
    for key in internal_kv._internal_kv_list(_signals_key(app, deployment), namespace=NAMESPACE):
        value = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
        if value is not None:
            signals = json.loads(value)
            if now - signals["published_at"] <= max_age_s:
                out.append(signals)
    return out


def publish_decision(app: str, deployment: str, decision: dict) -> None:
    value = json.dumps(decision | {"published_at": time.time()}).encode()
    internal_kv._internal_kv_put(_decision_key(app, deployment), value, namespace=NAMESPACE)


def read_decision(app: str, deployment: str) -> dict | None:
    value = internal_kv._internal_kv_get(_decision_key(app, deployment), namespace=NAMESPACE)
    return None if value is None else json.loads(value)
