"""LoRA adapters at run time: ``/admin/adapters`` and every router's poll of the registrations.

A registration is checked by one of the model's replicas first (its engine reads the directory and
refuses what does not fit the base model: a 400 here, nothing registered), then published in the
GCS (``adapter_board.py``), which every router of the deployment reads at each monitor poll. Other
replicas read the directory the first time one of their requests names the adapter.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from ray.serve.handle import DeploymentHandle

from cluster.errors import BadRequest, NotFound
from cluster.model_settings import MODEL_NAME_PATTERN
from cluster.routing import adapter_board
from cluster.routing.adapter_registry import Adapter, AdapterRegistry

log = logging.getLogger(__name__)


class AdapterRegistration(BaseModel):
    """``POST /admin/adapters``'s body."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=MODEL_NAME_PATTERN, description="The adapter's API name (a request's `model`).")
    model: str = Field(description="The served base model it runs on.")
    path: str = Field(min_length=1, description="PEFT LoRA directory, readable on the replicas' nodes.")


def card(adapter: Adapter) -> dict[str, Any]:
    """An adapter as an OpenAI model object: ``parent`` names its base model."""
    return {
        "id": adapter.name,
        "object": "model",
        "created": 0,
        "owned_by": "fairlane",
        "parent": adapter.model,
    }


def listing(registry: AdapterRegistry) -> dict[str, Any]:
    return {
        "adapters": [
            {"name": a.name, "model": a.model, "path": a.path, "source": a.source} for a in registry.all()
        ]
    }


class AdapterAdmin:
    """One router's side of the run-time registrations (``app``/``generation``: its deployment's)."""

    def __init__(
        self, registry: AdapterRegistry, replicas: dict[str, DeploymentHandle], app: str, generation: str
    ):
        self._registry = registry
        self._replicas = replicas
        self._app, self._generation = app, generation

    async def register(self, body: AdapterRegistration) -> dict[str, Any]:
        if body.model not in self._replicas:
            raise NotFound(f"the model {body.model!r} is not served", code="model_not_found", param="model")
        why = self._registry.conflict(body.name, self._replicas)
        if why is not None:
            raise BadRequest(f"cannot register this adapter: {why}", code="adapter_conflict", param="name")
        problem = await self._replicas[body.model].check_adapter.remote(body.name, body.path)
        if problem is not None:  # the replica's engine read the directory and refused it
            raise BadRequest(f"the adapter cannot be served: {problem}", code="invalid_adapter", param="path")
        adapter = Adapter(body.name, body.model, body.path, source="admin")
        await asyncio.to_thread(adapter_board.register, self._app, self._generation, adapter)
        await self.poll()
        return {"registered": card(adapter)}

    async def unregister(self, name: str) -> dict[str, Any]:
        found = self._registry.get(name)
        if found is not None and found.source == "config":
            raise BadRequest(
                f"{name!r} is an adapter of the config (change it there)", code="adapter_conflict"
            )
        if not await asyncio.to_thread(adapter_board.unregister, self._app, self._generation, name):
            raise NotFound(f"no adapter {name!r} was registered", code="adapter_not_found", param="name")
        await self.poll()
        return {"removed": name}

    async def poll(self) -> None:
        """Take the deployment's registrations as they are now; a failed read keeps the last ones."""
        if not self._generation:  # outside a composed app (tests of one router): the config's only
            return
        try:
            adapters = await asyncio.to_thread(adapter_board.registered, self._app, self._generation)
        except Exception as exc:  # the GCS restarting: the next poll tries again
            log.warning("adapter registrations not read: %s", exc)
            return
        self._registry.replace_runtime(a for a in adapters if re.match(MODEL_NAME_PATTERN, a.name))
