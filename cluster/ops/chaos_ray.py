"""Ray-side faults and checks for the drills (needs a Ray connection: tests, or ``--ray-address``)."""

from __future__ import annotations

import asyncio

import ray
from ray import serve


def replica_actor_names(app: str, deployment: str = "Replica") -> list[str]:
    """Names of the live replica actors of ``deployment`` in ``app`` (Serve names them app#deployment#id)."""
    marker = f"{app}#{deployment}#"
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if marker in a["name"])


def running_replicas(app: str, deployment: str = "Replica") -> int:
    status = serve.status().applications.get(app)
    if status is None or deployment not in status.deployments:
        return 0
    return int(status.deployments[deployment].replica_states.get("RUNNING", 0))


class ReplicaKiller:
    """Kills one replica actor (as a crash would: no graceful shutdown) and tells when Serve replaced it."""

    def __init__(self, app: str, deployment: str = "Replica") -> None:
        self.app = app
        self.deployment = deployment
        self.killed: str | None = None
        self._expected = 0

    async def kill(self) -> str:
        names = replica_actor_names(self.app, self.deployment)
        if not names:
            raise RuntimeError(f"no replica of {self.app}/{self.deployment} to kill")
        self._expected = len(names)
        self.killed = names[0]
        ray.kill(ray.get_actor(self.killed, namespace="serve"), no_restart=True)
        return self.killed

    async def recovered(self) -> bool:
        """The killed actor is gone, a new one runs, and Serve counts the full set RUNNING again."""
        names = await asyncio.to_thread(replica_actor_names, self.app, self.deployment)
        if self.killed in names or len(names) < self._expected:
            return False
        return await asyncio.to_thread(running_replicas, self.app, self.deployment) >= self._expected
