"""Fault 6 as a real process: SIGTERM to ``fairlane serve`` drains, then the process exits 0.

``test_drain.py`` drives the drain functions inside the shared test cluster; this one runs the
whole path an operator relies on: the CLI's SIGTERM handler, ``local_cluster`` draining, Serve and
Ray shutting down. The subprocess starts its own Ray; it must not join the test session's (which a
child would find through ``RAY_ADDRESS``) nor share its temp dir, so both are set apart below.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tenancy import DEMO_KEYS
from tests.faults.fault_helpers import MODEL, wait_for
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[2]
DRAIN_TIMEOUT_S = 30.0
START_TIMEOUT_S = 150.0  # a second Ray + Serve + SmolLM2 on a busy 2-core box
EXIT_TIMEOUT_S = DRAIN_TIMEOUT_S + 30.0  # drain, then Serve and Ray shutdown


def _serve_config(path: Path, port: int) -> Path:
    config = {
        "engine": {"device": "cpu", "kv_cache_tokens": 4096, "max_num_seqs": 4},
        "num_replicas": 1,
        "replica_num_cpus": 0.5,
        "replica_room": 2,
        "load_poll_interval_s": 0.2,
        "drain_timeout_s": DRAIN_TIMEOUT_S,
        "port": port,
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """``fairlane serve`` in its own session with a private Ray temp dir; killed as a group at the end."""
    port = free_port()
    ray_tmp = tempfile.mkdtemp(prefix="fl-drain-", dir="/tmp")  # short: Ray's socket paths have a limit
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env |= {"RAY_TMPDIR": ray_tmp, "PYTHONPATH": str(REPO)}
    log = tmp_path / "serve.log"
    fairlane = str(Path(sys.executable).with_name("fairlane"))  # the installed entry point operators run
    cmd = [fairlane, "serve", "--config", str(_serve_config(tmp_path / "app.yaml", port))]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield proc, f"http://127.0.0.1:{port}", log
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).json().get("status") == "ok"
    except (httpx.HTTPError, ValueError):
        return False


def _stream(url: str, out: list[str]) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count from one to fifty."}],
        "max_tokens": 96,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {DEMO_KEYS['bob']}"}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
        out.extend(line for line in r.iter_lines() if line.startswith("data: "))


def _refused(url: str) -> bool:
    probe = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"Authorization": f"Bearer {DEMO_KEYS['alice']}"}
    try:
        r = httpx.post(f"{url}/v1/chat/completions", json=probe, headers=headers, timeout=10)
    except httpx.TransportError:  # a connection cut while the signal lands: ask again
        return False
    return r.status_code == 503 and r.json()["error"]["code"] == "draining" and "retry-after" in r.headers


@pytest.mark.own_ray
def test_sigterm_drains_then_exits_zero(served: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    proc, url, log = served
    assert wait_for(lambda: _healthy(url) or proc.poll() is not None, timeout_s=START_TIMEOUT_S)
    assert proc.poll() is None, log.read_text()[-3000:]
    lines: list[str] = []
    streamer = threading.Thread(target=_stream, args=(url, lines))
    streamer.start()
    assert wait_for(lambda: len(lines) >= 2, timeout_s=60)  # the stream is under way
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert wait_for(lambda: _refused(url), timeout_s=10)  # new work: 503 draining + Retry-After
    assert streamer.is_alive()  # the probe was refused while the stream was still in flight
    streamer.join(timeout=DRAIN_TIMEOUT_S)
    assert not streamer.is_alive()
    assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines), lines[-3:]
    assert time.monotonic() - sent < DRAIN_TIMEOUT_S
    assert proc.wait(timeout=EXIT_TIMEOUT_S) == 0, log.read_text()[-3000:]
