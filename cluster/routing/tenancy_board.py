"""The cluster-wide tenancy version: what every router of an app deployment applies, in Ray's GCS.

``POST /admin/tenants/reload`` reaches one router (the HTTP proxy picks it), but every router must
apply the same config. The router that takes the reload publishes the validated text under its
version (a hash of the text) and points ``current`` at it; each router reads ``current`` every
monitor poll, applies a newer version and reports the one it applied, so the publisher can tell
when all have. Like the drain flag (``cluster/drain.py``) this lives in the GCS key-value store:
it outlives any router, costs no process of its own, and a router started later reads it first.

Keys carry the deployment's generation (a random id ``cluster.app.compose`` gives the routers of
one deployment), so a redeployed app starts from its own tenancy file, not from a reload made on a
deployment before it. Texts are kept per version and never rewritten, so two reloads that race
cannot leave ``current`` pointing at another version's text.
"""

from __future__ import annotations

import hashlib

from ray.experimental import internal_kv

NAMESPACE = "fairlane"


def tenancy_version(text: str) -> str:
    """The version of a tenancy config: a hash of its text (equal texts, equal versions)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _key(app: str, generation: str, *parts: str) -> bytes:
    return ":".join(("tenancy", app, generation, *parts)).encode()


def publish(app: str, generation: str, version: str, text: str) -> None:
    """Make ``version`` (with its text) the one every router of the deployment applies."""
    internal_kv._internal_kv_put(_key(app, generation, "text", version), text.encode(), namespace=NAMESPACE)
    internal_kv._internal_kv_put(_key(app, generation, "current"), version.encode(), namespace=NAMESPACE)


def current(app: str, generation: str) -> str | None:
    """The published version, or None when nothing was reloaded in this deployment."""
    value = internal_kv._internal_kv_get(_key(app, generation, "current"), namespace=NAMESPACE)
    return None if value is None else value.decode()


def text_of(app: str, generation: str, version: str) -> str | None:
    value = internal_kv._internal_kv_get(_key(app, generation, "text", version), namespace=NAMESPACE)
    return None if value is None else value.decode()


def report_applied(app: str, generation: str, router: str, version: str) -> None:
    """A router's word that it now enforces ``version``."""
    key = _key(app, generation, "applied", router)
    internal_kv._internal_kv_put(key, version.encode(), namespace=NAMESPACE)


def applied_by_routers(app: str, generation: str) -> dict[str, str]:
    """Router id -> the version it last reported."""
    prefix = _key(app, generation, "applied", "")
    out: dict[str, str] = {}
    for key in internal_kv._internal_kv_list(prefix, namespace=NAMESPACE):
        value = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
        if value is not None:
            out[key.decode().rsplit(":", 1)[1]] = value.decode()
    return out


def forget_router(app: str, generation: str, router: str) -> None:
    """A stopping router's report goes with it: the count of routers that applied a version is of
    live ones (a crashed router's report stays, but its replacement starts from ``current``)."""
    internal_kv._internal_kv_del(_key(app, generation, "applied", router), namespace=NAMESPACE)
