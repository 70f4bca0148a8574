"""The replicas Serve routes to, per deployment, as this process's request routers last heard.

Serve's controller pushes each handle's request router the set of RUNNING replicas; a replica it
is stopping (scale-down, rolling update) leaves that set at once, while its requests run on. The
dispatcher reads the set to stop counting those requests against the room of the replicas that
stay (``Dispatcher.set_live``). Written by ``KVAwareRouter.update_replicas`` (on Serve's router
loop), read by the replica monitor (on the router's loop): one reference swap per update.
"""

from __future__ import annotations

_LIVE: dict[tuple[str, str], frozenset[str]] = {}


def publish(app: str, deployment: str, replica_ids: frozenset[str]) -> None:
    _LIVE[(app, deployment)] = replica_ids


def live_replicas(app: str, deployment: str) -> frozenset[str] | None:
    """The replica ids of ``deployment`` Serve routes to, or None before any router heard of them."""
    return _LIVE.get((app, deployment))
