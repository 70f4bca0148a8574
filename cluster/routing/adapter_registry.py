"""Which LoRA adapters a router serves, on which base model, from which directory.

An adapter is served under its own name (a request's ``model``) on its base model's replicas: the
request joins the base model's pool (its quotas, fair queue and SLA class) and carries the adapter's
name and directory to the replica, whose engine loads it on first use (docs/cluster.md, "LoRA
adapters"). Adapters come from the config (``engine.lora_adapters`` of each model) and from
``POST /admin/adapters`` at run time, which every router of the deployment reads from the GCS
(``adapter_board.py``). Pure: no Ray.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Adapter:
    name: str
    model: str  # the base model's served name
    path: str
    source: str = "config"  # or "admin": registered at run time


class AdapterRegistry:
    """Adapters by name: the config's, then those registered at run time (``replace_runtime``)."""

    def __init__(self, configured: Mapping[str, Mapping[str, str]]) -> None:
        """``configured``: base model name -> {adapter name: directory}."""
        self._configured = {
            name: Adapter(name, model, path)
            for model, named in configured.items()
            for name, path in named.items()
        }
        self._runtime: dict[str, Adapter] = {}

    def get(self, name: str) -> Adapter | None:
        return self._configured.get(name) or self._runtime.get(name)

    def all(self) -> list[Adapter]:
        """Every adapter, the config's first, each group by name."""
        runtime = [a for n, a in sorted(self._runtime.items()) if n not in self._configured]
        return sorted(self._configured.values(), key=lambda a: a.name) + runtime

    def replace_runtime(self, adapters: Iterable[Adapter]) -> None:
        """The adapters registered at run time, as the board lists them now (removed ones vanish)."""
        self._runtime = {a.name: a for a in adapters}

    def conflict(self, name: str, models: Iterable[str]) -> str | None:
        """Why ``name`` cannot be registered: a served model's name, or a configured adapter's."""
        if name in set(models):
            return f"{name!r} is a served model's name"
        if name in self._configured:
            return f"{name!r} is an adapter of the config (change it there)"
        return None
