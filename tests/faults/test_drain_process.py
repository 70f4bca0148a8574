"""Fault 6 as a real process: SIGTERM to ``fairlane serve`` drains, then the process exits 0.

``test_drain.py`` drives the drain functions inside the shared test cluster; this one runs the
whole path an operator relies on: the CLI's SIGTERM handler, ``local_cluster`` draining, Serve and
Ray shutting down. The subprocess starts its own Ray; it must not join the test session's (which a
child would find through ``RAY_ADDRESS``) nor share its temp dir, so both are set apart below.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from fairlane import cli
from tenancy import DEMO_KEYS
from tests.faults.fault_helpers import MODEL, wait_for
from tests.redis_server import free_port

REPO = Path(__file__).resolve().parents[2]
DRAIN_TIMEOUT_S = 30.0
START_TIMEOUT_S = 150.0  # a second Ray + Serve + SmolLM2 on a busy 2-core box
EXIT_TIMEOUT_S = DRAIN_TIMEOUT_S + 30.0  # drain, then Serve and Ray shutdown
ENDINGS = ("completed", "rejected", "errored", "aborted")


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


def _stream(url: str, out: list[str], endings: Counter[str]) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count from one to fifty."}],
        # Its whole length (no EOS): in flight while the SIGTERM reaches the routers on a loaded box
        # (96 tokens that could end at EOS were seen done before the first probe was refused).
        "max_tokens": 160,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {DEMO_KEYS['bob']}"}
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
            out.extend(line for line in r.iter_lines() if line.startswith("data: "))
    except httpx.HTTPError:  # a cut stream: the lines so far stay for the assertion message
        endings["errored"] += 1
        return
    done = bool(out) and out[-1] == "data: [DONE]" and not any('"error"' in line for line in out)
    endings["completed" if done else "errored"] += 1


def _refused(url: str, endings: Counter[str]) -> bool:
    """One probe; every probe ends once: refused while draining, served if admitted first, or an error."""
    probe = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"Authorization": f"Bearer {DEMO_KEYS['alice']}"}
    try:
        r = httpx.post(f"{url}/v1/chat/completions", json=probe, headers=headers, timeout=10)
    except httpx.TransportError:  # the server must keep answering while it drains
        endings["errored"] += 1
        return False
    refused = r.status_code == 503 and r.json()["error"]["code"] == "draining" and "retry-after" in r.headers
    endings["rejected" if refused else "completed" if r.status_code == 200 else "errored"] += 1
    return refused


@pytest.mark.slow
@pytest.mark.own_ray
def test_sigterm_drains_then_exits_zero(served: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    proc, url, log = served
    assert wait_for(lambda: _healthy(url) or proc.poll() is not None, timeout_s=START_TIMEOUT_S)
    assert proc.poll() is None, log.read_text()[-3000:]
    lines: list[str] = []
    endings: Counter[str] = Counter()
    sent = 1  # the stream; each probe below adds one
    streamer = threading.Thread(target=_stream, args=(url, lines, endings))
    streamer.start()
    assert wait_for(lambda: len(lines) >= 2, timeout_s=60)  # the stream is under way
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    probes = 0

    def refused() -> bool:
        nonlocal probes
        probes += 1
        return _refused(url, endings)

    assert wait_for(refused, timeout_s=10), log.read_text()[-3000:]  # new work: 503 draining + Retry-After
    sent += probes
    assert streamer.is_alive()  # the probe was refused while the stream was still in flight
    streamer.join(timeout=DRAIN_TIMEOUT_S)
    assert not streamer.is_alive()
    assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines), lines[-3:]
    assert time.monotonic() - signalled < DRAIN_TIMEOUT_S
    assert proc.wait(timeout=EXIT_TIMEOUT_S) == 0, log.read_text()[-3000:]
    # Every request ended exactly once, and nothing was cut or lost on the way out.
    assert sent == sum(endings[e] for e in ENDINGS), (sent, endings)
    assert endings["errored"] == endings["aborted"] == 0 and endings["rejected"] >= 1, endings


@pytest.mark.timeout(15)  # before the fix the CLI waited for a SIGTERM that had already come
def test_sigterm_while_starting_is_a_graceful_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The window the process test above once lost: Serve already answers (the app is not yet
    RUNNING for the CLI) when SIGTERM comes. It must reach the CLI's handler, not the one
    ``ray.init`` left (here a stand-in that records), and the block must end normally, i.e. drain."""
    ray_handler_hits: list[int] = []
    block: dict[str, bool] = {}

    @contextlib.contextmanager
    def fake_cluster(cfg, address=None, on_ray_up=None) -> Iterator[str]:
        signal.signal(signal.SIGTERM, lambda signum, frame: ray_handler_hits.append(signum))  # ray.init's
        if on_ray_up is not None:
            on_ray_up()
        os.kill(os.getpid(), signal.SIGTERM)  # the port is open, deploy() still waits for RUNNING
        yield "http://127.0.0.1:1"
        block["ended_normally"] = True  # local_cluster drains here

    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(cli, "local_cluster", fake_cluster)
    try:
        result = CliRunner().invoke(cli.app, ["serve"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 0, result.output
    assert ray_handler_hits == [] and block == {"ended_normally": True}
