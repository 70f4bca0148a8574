"""A replica's LoRA adapters: read on first use, from the directory the router's registry names.

Routers carry each adapter request's name and directory (``GenerateArgs.adapter_path``), so a replica
started later (autoscaling, a replacement) serves every adapter without a broadcast: the first
request that names one here has its engine read it (off the event loop), and requests that arrive
meanwhile wait for that one read. A name registered again with another directory is read again.
"""

from __future__ import annotations

import asyncio

from replica import InvalidRequestError


class ReplicaAdapters:
    def __init__(self, engine) -> None:
        self._engine = engine
        # name -> the directory its engine registration was read from (the config's, read at start)
        self._paths: dict[str, str] = dict(getattr(engine.config, "lora_adapters", ()))
        self._reads: dict[str, asyncio.Future] = {}  # name -> the read under way

    async def ensure(self, name: str, path: str | None) -> None:
        """The adapter registered with the engine from ``path``; the engine's error when it cannot be."""
        if path is None:
            raise InvalidRequestError(f"adapter {name!r}: no directory given")
        while self._paths.get(name) != path:
            pending = self._reads.get(name)
            if pending is not None:  # another request is reading it: wait for that read, then look again
                await asyncio.shield(pending)
                continue
            self._reads[name] = asyncio.get_running_loop().create_task(self._read(name, path))
            try:
                await asyncio.shield(self._reads[name])
            finally:
                if self._reads.get(name) is not None and self._reads[name].done():
                    del self._reads[name]

    async def _read(self, name: str, path: str) -> None:
        if name in self._paths:  # registered again with another directory
            await asyncio.to_thread(self._engine.remove_adapter, name)
            del self._paths[name]
        await asyncio.to_thread(self._engine.add_adapter, name, path)
        self._paths[name] = path

    async def check(self, name: str, path: str) -> str | None:
        """None when the engine serves the adapter from ``path`` (read now); else why it cannot."""
        try:
            await self.ensure(name, path)
        except InvalidRequestError as exc:
            return str(exc)
        return None

    def resident(self) -> list[str]:
        """Adapters in the engine's device slots now (the routers prefer a replica holding one)."""
        return list(self._engine.resident_adapters()) if self._paths else []
