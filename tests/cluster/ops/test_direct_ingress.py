"""``fairlane serve --edge proxy --direct-ingress`` end to end: beside Serve's proxy, the router serves
the OpenAI API on its own port. (The default edge, HAProxy over the routers' ports: test_haproxy_edge.py.)

Serve reads RAY_SERVE_ENABLE_DIRECT_INGRESS once per process, when Ray starts, so the test cannot
use the session's shared Ray: ``fairlane serve`` runs as a subprocess with a Ray of its own (no
``RAY_ADDRESS``, a private temp dir, as in ``tests/faults/test_drain_process.py``), and the marker
runs it before the shared Ray starts. The real ``openai`` client talks to the URL the command
prints; the proxy's port keeps answering too, and SIGTERM still ends the process promptly (a
direct-ingress router's 30 s minimum drain does not hold up the exit of a Ray we started).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from cluster.ops.direct_ingress import FIRST_PORT, LAST_PORT
from tenancy import DEMO_ADMIN_KEY, DEMO_KEYS
from tests.cluster.own_serve import own_serve
from tests.faults.fault_helpers import MODEL, wait_for
from tests.redis_server import free_port

START_TIMEOUT_S = 150.0  # a Ray of its own + Serve + SmolLM2 on a busy 2-core box
EXIT_TIMEOUT_S = 30.0
ROUTER_LINE = re.compile(r"router \(direct ingress, no proxy hop\) at (http://[\d.]+:(\d+))/v1")
QUESTION = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """``fairlane serve --edge proxy --direct-ingress`` in its own session and Ray."""
    port = free_port()
    config = {
        "engine": {"device": "cpu", "kv_cache_tokens": 2048, "max_num_seqs": 2},
        "replica_num_cpus": 0.5,
        "replica_room": 2,
        "drain_timeout_s": 5.0,
        "port": port,
    }
    with own_serve(tmp_path, config, "--edge", "proxy", "--direct-ingress", prefix="fl-di-") as proc:
        yield proc, port, tmp_path / "serve.log"


def _health(url: str) -> str:
    return httpx.get(f"{url}/health", timeout=10).json()["status"]


def _router_url(log: Path) -> str | None:
    match = ROUTER_LINE.search(log.read_text(errors="replace"))
    return match.group(1) if match else None


@pytest.mark.own_ray  # before the session's shared Ray starts: one Ray on the box at a time
def test_the_router_answers_on_its_own_port(served: tuple[subprocess.Popen[bytes], int, Path]) -> None:
    proc, proxy_port, log = served
    assert wait_for(lambda: _router_url(log) or proc.poll() is not None, timeout_s=START_TIMEOUT_S)
    url = _router_url(log)
    assert url is not None, log.read_text()[-3000:]
    router_port = int(url.rsplit(":", 1)[1])
    assert FIRST_PORT <= router_port < LAST_PORT and router_port != proxy_port

    # Serve's own health route on the router's port, and fairlane's.
    assert httpx.get(f"{url}/-/healthz", timeout=10).text == "success"
    # The router's first replica poll (load_poll_interval_s) may follow the printed URL by a moment:
    # until then /health says no_replicas, as it does through the proxy.
    assert wait_for(lambda: _health(url) == "ok", timeout_s=30), _health(url)

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=DEMO_KEYS["alice"], max_retries=0, timeout=60)
    plain = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0)
    answer = plain.choices[0].message.content
    assert answer and plain.usage.completion_tokens > 0

    # Streamed: every chunk arrives, then the end; the text is the plain answer's (greedy).
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == plain.usage.completion_tokens

    # The router's code runs on Serve's own loop (router_on_serve_loop), not in Serve's user-code thread.
    admin = {"Authorization": f"Bearer {DEMO_ADMIN_KEY}"}
    state = httpx.get(f"{url}/admin/state", headers=admin, timeout=10).json()
    assert "_run_user_code_event_loop" not in state["loop_thread"], state["loop_thread"]
    assert state["loop_holds"] is None  # the loop watch is off by default

    # The proxy (head node) still routes to the same router.
    proxied = httpx.post(
        f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
        json={"model": MODEL, "messages": QUESTION, "max_tokens": 8, "temperature": 0},
        headers={"Authorization": f"Bearer {DEMO_KEYS['alice']}"},
        timeout=60,
    )
    assert proxied.status_code == 200 and proxied.json()["choices"][0]["message"]["content"] == answer

    # Streamed through the proxy: the same text. The router's own port pushed its stream's outputs
    # straight to the client's socket; the proxy's went through Serve's ASGI messages.
    with httpx.stream(
        "POST",
        f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
        json={"model": MODEL, "messages": QUESTION, "max_tokens": 8, "temperature": 0, "stream": True},
        headers={"Authorization": f"Bearer {DEMO_KEYS['alice']}"},
        timeout=60,
    ) as proxied_stream:
        lines = [line[6:] for line in proxied_stream.iter_lines() if line.startswith("data: ")]
    pieces = [json.loads(line)["choices"] for line in lines[:-1]]
    assert lines[-1] == "[DONE]"
    assert "".join(p[0]["delta"].get("content") or "" for p in pieces if p) == answer
    state = httpx.get(f"{url}/admin/state", headers=admin, timeout=10).json()
    assert state["stream_paths"] == {"pushed": 1, "pulled": 1}

    # SIGTERM: drained (nothing in flight) and gone, Ray with it.
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=EXIT_TIMEOUT_S) == 0, log.read_text()[-3000:]
    assert time.monotonic() - signalled < EXIT_TIMEOUT_S


def test_a_ray_started_here_gets_the_variables_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    from cluster.config import AppConfig
    from cluster.ops.edge import SIDE_PORT_VARS, edge_env
    from cluster.ops.local_cluster import ray_env

    for name in (*edge_env("haproxy", True), *SIDE_PORT_VARS):  # each restored after the test
        monkeypatch.delenv(name, raising=False)
    # The proxy without direct ingress sets nothing: an operator's own value stays.
    ray_env(proxy_grpc=None, config=AppConfig(edge="proxy"))
    assert "RAY_SERVE_ENABLE_DIRECT_INGRESS" not in os.environ
    ray_env(proxy_grpc=None, config=AppConfig(edge="proxy", direct_ingress=True))
    assert os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    assert os.environ["RAY_SERVE_PORT_QUARANTINE_S"] == "0"  # a restarted router takes its port back
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ
    ray_env(proxy_grpc=None, config=AppConfig())  # the default edge: HAProxy over the routers' own ports
    assert os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    assert "empty-response" in os.environ["RAY_SERVE_HAPROXY_RETRY_ON"]
    side = [int(os.environ[v]) for v in SIDE_PORT_VARS]
    assert len(set(side)) == 4 and 8404 not in side  # free ports of this machine, not Serve's fixed ones
    ray_env(proxy_grpc=None, config=AppConfig(edge="proxy"))  # back to the proxy in this process
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ


def test_router_urls_name_the_routers_not_the_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    from cluster.ops import direct_ingress

    router = "SERVE_REPLICA::fairlane#Router"  # Serve's replica actor names

    def group(app: str, protocol: str, *targets: tuple[str, int]) -> dict:
        named = [{"ip": "10.0.0.7", "port": p, "instance_id": "", "name": n} for n, p in targets]
        return {"app_name": app, "protocol": protocol, "route_prefix": "/", "targets": named}

    details = {
        "target_groups": [
            group("fairlane", "HTTP", (f"{router}#b", 30001), (f"{router}#a", 30000)),
            group("fairlane", "GRPC", (f"{router}#a", 40000)),
            group("other", "HTTP", ("SERVE_REPLICA::other#Router#c", 30002)),
            group("proxied", "HTTP", ("SERVE_PROXY_ACTOR-node", 8000)),
        ]
    }  # fmt: skip

    class Client:
        def get_serve_details(self) -> dict:
            return details

    monkeypatch.setattr(direct_ingress, "_get_global_client", Client)
    local = ["http://127.0.0.1:30000", "http://127.0.0.1:30001"]
    assert direct_ingress.router_urls("fairlane", "127.0.0.1") == local  # bound to loopback: reached there
    assert direct_ingress.router_urls("fairlane", "0.0.0.0") == [
        "http://10.0.0.7:30000",
        "http://10.0.0.7:30001",
    ]
    assert direct_ingress.router_urls("proxied", "0.0.0.0") == []  # direct ingress off: proxies only
