"""Tenants end to end: rate limits per tenant, disconnects that give everything back, fairness."""

from __future__ import annotations

import statistics
import threading

import httpx
import openai
from ray import serve

from tests.cluster.conftest import APP
from tests.cluster.helpers import ALICE, BOB, CAROL, LIMITED_KEY, MODEL, admin_state, stream_ttft, wait_until

QUESTION = [{"role": "user", "content": "Name a colour."}]


def test_tenant_over_rpm_gets_429_while_another_is_served(base_url: str) -> None:
    limited = openai.OpenAI(base_url=f"{base_url}/v1", api_key=LIMITED_KEY, max_retries=0)
    bob = openai.OpenAI(base_url=f"{base_url}/v1", api_key=BOB, max_retries=0)
    for _ in range(2):
        limited.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
    raw = httpx.post(
        f"{base_url}/v1/chat/completions",
        timeout=30,
        json={"model": MODEL, "messages": QUESTION, "max_tokens": 2},
        headers={"Authorization": f"Bearer {LIMITED_KEY}"},
    )
    assert raw.status_code == 429
    assert int(raw.headers["retry-after"]) >= 1
    assert raw.headers["x-ratelimit-limit-requests"] == "2"
    assert raw.headers["x-ratelimit-remaining-requests"] == "0"
    assert raw.json()["error"]["code"] == "rpm"
    served = bob.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2)
    assert served.choices[0].finish_reason in ("stop", "length")
    metrics = httpx.get(f"{base_url}/metrics").text
    assert 'fairlane_rejections_total{reason="rpm",sla_class="standard",tenant="limited"} 1.0' in metrics


def _replica_load() -> dict:
    return serve.get_deployment_handle("Replica", APP).load.remote().result(timeout_s=10)


def test_disconnect_mid_stream_frees_kv_and_quota(base_url: str) -> None:
    assert wait_until(lambda: _replica_load()["running"] == 0)
    baseline = _replica_load()["kv_blocks_used"]
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
    }
    seen = []
    with httpx.stream(
        "POST",
        f"{base_url}/v1/chat/completions",
        json=body,
        timeout=60,
        headers={"Authorization": f"Bearer {CAROL}"},
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                seen.append(line)
            if len(seen) == 4:
                break  # leaving the block closes the connection mid-stream
    assert all('"finish_reason":null' in line for line in seen)
    assert wait_until(lambda: _replica_load()["running"] == 0 and _replica_load()["waiting"] == 0)
    assert _replica_load()["kv_blocks_used"] == baseline
    assert wait_until(lambda: admin_state(base_url)["active_leases"]["carol"] == 0)
    assert admin_state(base_url)["in_flight"] == 0


def _flood(base_url: str, stop: threading.Event, streams: int) -> list[int]:
    statuses: list[int] = []

    def worker() -> None:
        with httpx.Client(timeout=120) as c:
            while not stop.is_set():
                body = {
                    "model": MODEL,
                    "prompt": "Count slowly from one to one hundred:",
                    "max_tokens": 48,
                    "temperature": 0.8,
                    "seed": 1,
                }
                statuses.append(
                    c.post(
                        f"{base_url}/v1/completions", json=body, headers={"Authorization": f"Bearer {CAROL}"}
                    ).status_code
                )

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(streams)]
    for t in threads:
        t.start()
    stop.wait()
    for t in threads:
        t.join(timeout=120)
    return statuses


def _p99_rounds(base_url: str, prompts: list[str], rounds: int) -> list[float]:
    """The quiet tenant's TTFT p99 (of 16 requests, so their maximum) in each of `rounds` rounds."""
    return [max(stream_ttft(base_url, ALICE, p, 4) for p in prompts) for _ in range(rounds)]


def test_noisy_tenant_does_not_push_quiet_ttft_p99_past_1_5x(base_url: str) -> None:
    # A p99 of 16 requests is their maximum, which one stall of this shared 2-core box decides (a
    # single round read 1.2x to 1.8x across runs of the same code). Each side is therefore the
    # median of three rounds' p99: the bound is the same, the estimate is steadier.
    prompts = [f"Name a fruit that starts with the letter {c}." for c in "ABCDEFGHIJKLMNOP"]
    stream_ttft(base_url, ALICE, prompts[0], 4)  # warm the path
    solo = _p99_rounds(base_url, prompts, 3)
    stop = threading.Event()
    statuses: list[int] = []
    flood = threading.Thread(target=lambda: statuses.extend(_flood(base_url, stop, 10)), daemon=True)
    flood.start()
    try:
        assert wait_until(
            lambda: admin_state(base_url)["queued"] > 0, timeout_s=30
        )  # the noisy backlog is real
        loaded = _p99_rounds(base_url, prompts, 3)
        queued_while_loaded = admin_state(base_url)["queued"]
    finally:
        stop.set()
        flood.join(timeout=180)
    p99_solo, p99_loaded = statistics.median(solo), statistics.median(loaded)
    assert queued_while_loaded > 0
    assert statuses and set(statuses) == {200}
    assert p99_loaded <= 1.5 * p99_solo, (solo, loaded)
