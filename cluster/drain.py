"""Graceful drain: the operator's process asks every router of an app to stop admitting, then waits.

The signal travels through Ray's GCS key-value store (``internal_kv``) because a Serve handle call
reaches one router chosen by load, while a drain must reach all of them. Each router reads the
flag in its monitor loop (every ``load_poll_interval_s``), then answers new requests with 503 +
``Retry-After`` and publishes how many requests it still holds, so the operator's process knows
when the last in-flight stream has finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from types import FrameType

from ray.experimental import internal_kv

log = logging.getLogger(__name__)

NAMESPACE = "fairlane"


def _flag_key(app: str) -> bytes:
    return f"drain:{app}".encode()


def _held_key(app: str, router: str) -> bytes:
    return f"held:{app}:{router}".encode()


def request_drain(app: str) -> None:
    """Tell every router of ``app`` to stop admitting new requests."""
    internal_kv._internal_kv_put(_flag_key(app), b"1", overwrite=True, namespace=NAMESPACE)


def clear_drain(app: str) -> None:
    """Admit again (a drill that drained a live app puts it back into service)."""
    internal_kv._internal_kv_del(_flag_key(app), namespace=NAMESPACE)
    internal_kv._internal_kv_del(f"held:{app}:".encode(), del_by_prefix=True, namespace=NAMESPACE)


def drain_requested(app: str) -> bool:
    """Read by each router's monitor loop."""
    return internal_kv._internal_kv_exists(_flag_key(app), namespace=NAMESPACE)


def publish_held(app: str, router: str, held: int) -> None:
    """A draining router's count of requests still waiting or in flight."""
    internal_kv._internal_kv_put(_held_key(app, router), str(held).encode(), namespace=NAMESPACE)


def held_by_routers(app: str) -> dict[str, int]:
    keys = internal_kv._internal_kv_list(f"held:{app}:".encode(), namespace=NAMESPACE)
    out: dict[str, int] = {}
    for key in keys:
        value = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
        if value is not None:
            out[key.decode().rsplit(":", 1)[1]] = int(value)
    return out


def wait_drained(app: str, routers: int, timeout_s: float, poll_s: float = 0.2) -> bool:
    """Wait until all ``routers`` report nothing held, or ``timeout_s``; True when drained."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = held_by_routers(app)
        if len(held) >= routers and sum(held.values()) == 0:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def drain(app: str, routers: int, timeout_s: float) -> bool:
    """Stop admitting and let in-flight requests finish within ``timeout_s``; True when all did."""
    request_drain(app)
    return wait_drained(app, routers, timeout_s)


class RouterDrain:
    """One router's view of the drain flag; ``poll`` runs in the monitor loop (GCS calls in a thread)."""

    def __init__(self, app: str, router: str, held: Callable[[], int]) -> None:
        self.app = app
        self.router = router
        self._held = held
        self.draining = False

    async def poll(self) -> None:
        try:
            if not self.draining:
                self.draining = await asyncio.to_thread(drain_requested, self.app)
                if self.draining:
                    log.warning("drain requested: admitting no new requests")
            else:
                self.draining = await asyncio.to_thread(drain_requested, self.app)  # cleared by a drill
            if self.draining:
                await asyncio.to_thread(publish_held, self.app, self.router, self._held())
        except Exception as exc:  # the GCS restarting: keep the previous state, try at the next poll
            log.warning("drain flag poll failed: %s", exc)


class StopSignal:
    """SIGTERM to ``fairlane serve``: a request to drain and stop, kept for the main thread.

    ``install`` must run after ``ray.init`` and before Serve opens its HTTP port. ``ray.init``
    puts SIGTERM handlers of its own in the driver, last the core worker's C++ failure-signal
    handler, which aborts the process: Ray's processes, started by it, go down with it, and every
    in-flight stream is cut. Installed before ``ray.init``, ours is replaced; installed once the app
    reports RUNNING, it leaves a window in which the port already serves but a SIGTERM aborts.
    A SIGTERM during start-up is kept: the app drains (nothing in flight) as soon as it is up.
    """

    def __init__(self, poll_s: float = 0.1) -> None:
        self.requested = False
        self._poll_s = poll_s

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag: the handler runs between the main thread's bytecodes, so a lock taken here
        # (threading.Event.set) could be one that thread already holds, and deadlock.
        self.requested = True

    def wait(self) -> None:
        """Block until SIGTERM or Ctrl-C (``poll_s`` latency: a sleep resumes after the handler)."""
        with contextlib.suppress(KeyboardInterrupt):
            while not self.requested:
                time.sleep(self._poll_s)
