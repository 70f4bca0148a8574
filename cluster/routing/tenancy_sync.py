"""One router's side of the cluster-wide tenancy version (``cluster/routing/tenancy_board.py``).

* Start: the version published in this deployment, if any (a router that Serve starts after a
  reload enforces what the others do), else the configured file.
* Poll (a monitor-loop duty, one GCS read): apply a version published by another router.
* Reload (the admin route): read and validate the file (a bad one changes nothing anywhere),
  publish it, apply it here, then wait, bounded, until every running router reports it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.config import AppConfig
from cluster.errors import BadRequest
from cluster.routing import tenancy_board as board
from tenancy import TenancyConfig, TenancyConfigError
from tenancy.loader import DEFAULT_CONFIG_PATH, parse_tenancy_text, read_tenancy_text

log = logging.getLogger(__name__)
WAIT_POLL_S = 0.1  # how often a reload checks the other routers' reports
# A reload waits this many monitor polls (5 s at least) for every router to apply it.
RELOAD_WAIT_POLLS, RELOAD_WAIT_MIN_S = 10, 5.0


@dataclass(frozen=True, slots=True)
class Tenancy:
    config: TenancyConfig
    version: str


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """What a reload reached: ``complete`` when every running router applied the version in time."""

    version: str
    tenants: tuple[str, ...]
    routers: int
    applied: int

    @property
    def complete(self) -> bool:
        return self.applied >= self.routers

    def body(self) -> dict[str, Any]:
        return {
            "status": "applied" if self.complete else "partial",
            "version": self.version,
            "tenants": list(self.tenants),
            "routers": self.routers,
            "routers_applied": self.applied,
        }


@dataclass(frozen=True, slots=True)
class Deployment:
    """Where this router's reports go: app, deployment generation and router id."""

    app: str
    generation: str
    router: str


class TenancySync:
    """Keeps this router on the deployment's tenancy version. Single event loop; GCS calls in threads."""

    def __init__(
        self,
        where: Deployment,
        source: Path,
        apply: Callable[[TenancyConfig], None],
        live_routers: Callable[[], int],
        wait_s: float,
        served_models: tuple[str, ...] = (),
    ) -> None:
        """``served_models``: when given, a config naming another model is invalid (never applied)."""
        self._where = where
        self._served = served_models
        self._source = source
        self._apply = apply
        self._live_routers = live_routers
        self._wait_s = wait_s
        self._refused: set[str] = set()  # published versions this router could not parse
        self.version = ""

    @classmethod
    def for_router(
        cls,
        config: AppConfig,
        where: Deployment,
        apply: Callable[[TenancyConfig], None],
        live_routers: Callable[[], int],
    ) -> TenancySync:
        """A router's: its configured file (the demo config when none), waits sized by its poll."""
        source = Path(config.tenancy_config) if config.tenancy_config else DEFAULT_CONFIG_PATH
        wait_s = max(RELOAD_WAIT_MIN_S, RELOAD_WAIT_POLLS * config.load_poll_interval_s)
        served = tuple(m.name for m in config.served_models)
        return cls(where, source, apply, live_routers, wait_s, served)

    async def initial(self) -> Tenancy:
        """What this router starts with; reported as applied (the caller builds its state from it)."""
        tenancy = await asyncio.to_thread(self._published)
        if tenancy is None:
            tenancy = self._parse(await asyncio.to_thread(read_tenancy_text, self._source), str(self._source))
        self.version = tenancy.version
        await asyncio.to_thread(self._report)
        return tenancy

    async def poll(self) -> None:
        """Apply a newer published version; a failed read keeps the current one until the next poll."""
        try:
            tenancy = await asyncio.to_thread(self._published)
            if tenancy is not None:
                self._use(tenancy)
                await asyncio.to_thread(self._report)
        except Exception as exc:  # the GCS restarting: try again at the next poll
            log.warning("tenancy version poll failed: %s", exc)

    async def reload(self) -> ReloadResult:
        """Publish the configured file to every router; ``BadRequest`` (and no change) when invalid."""
        try:
            text = await asyncio.to_thread(read_tenancy_text, self._source)
            tenancy = self._parse(text, str(self._source))
        except TenancyConfigError as exc:
            raise BadRequest(f"tenancy config not reloaded: {exc}", code="invalid_tenancy_config") from None
        w = self._where
        await asyncio.to_thread(board.publish, w.app, w.generation, tenancy.version, text)
        self._use(tenancy)
        await asyncio.to_thread(self._report)
        routers, applied = await self._wait_for_all(tenancy.version)
        tenants = tuple(t.id for t in tenancy.config.tenants)
        return ReloadResult(tenancy.version, tenants, routers, applied)

    def forget(self) -> None:
        """This router is stopping: its report goes (blocking; call from a thread)."""
        board.forget_router(self._where.app, self._where.generation, self._where.router)

    # ---- helpers ------------------------------------------------------------------------------
    def _parse(self, text: str, source: str) -> Tenancy:
        config = parse_tenancy_text(text, source)
        if self._served:
            config.check_models(self._served)
        return Tenancy(config, board.tenancy_version(text))

    def _published(self) -> Tenancy | None:
        """The deployment's published version when it is not the one applied here (blocking)."""
        w = self._where
        version = board.current(w.app, w.generation)
        if version is None or version == self.version or version in self._refused:
            return None
        text = board.text_of(w.app, w.generation, version)
        if text is None:
            return None
        try:
            return self._parse(text, f"published tenancy version {version}")
        except TenancyConfigError as exc:  # another code version's rules (a rolling update): keep ours
            log.error("tenancy version %s not applied: %s", version, exc)
            self._refused.add(version)
            return None

    def _use(self, tenancy: Tenancy) -> None:
        if tenancy.version != self.version:
            self._apply(tenancy.config)
            self.version = tenancy.version
            log.info("tenancy version %s applied (%d tenants)", tenancy.version, len(tenancy.config.tenants))

    def _report(self) -> None:
        w = self._where
        board.report_applied(w.app, w.generation, w.router, self.version)

    async def _wait_for_all(self, version: str) -> tuple[int, int]:
        """(running routers, how many of them report ``version``) once all do, or at the deadline."""
        deadline = time.monotonic() + self._wait_s
        while True:
            routers, applied = await asyncio.to_thread(self._count, version)
            if applied >= routers or time.monotonic() >= deadline:
                return routers, applied
            await asyncio.sleep(WAIT_POLL_S)

    def _count(self, version: str) -> tuple[int, int]:
        routers = self._live_routers()
        reports = board.applied_by_routers(self._where.app, self._where.generation)
        # A crashed router's report stays behind; never count more routers than run.
        return routers, min(routers, sum(v == version for v in reports.values()))
