"""Tenants end to end: rate limits per tenant, disconnects that give everything back, fairness."""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from ray import serve

from tests.cluster.conftest import APP
from tests.cluster.helpers import (
    ADMIN,
    ALICE,
    BOB,
    CAROL,
    LIMITED_KEY,
    MODEL,
    admin_state,
    stream_ttft,
    wait_until,
)

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
    metrics = httpx.get(f"{base_url}/metrics", headers=ADMIN).text
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


def _queue_wait(base_url: str, tenant: str) -> tuple[float, float]:
    """(sum, count) of the router's fair-queue wait histogram for `tenant`."""
    text = httpx.get(f"{base_url}/metrics", headers=ADMIN).text
    totals = {"sum": 0.0, "count": 0.0}
    for family in text_string_to_metric_families(text):
        if family.name != "fairlane_queue_wait_seconds":
            continue
        for sample in family.samples:
            kind = sample.name.rsplit("_", 1)[-1]
            if sample.labels.get("tenant") == tenant and kind in totals:
                totals[kind] += sample.value
    return totals["sum"], totals["count"]


def _mean_wait(before: tuple[float, float], after: tuple[float, float]) -> tuple[float, int]:
    count = int(after[1] - before[1])
    return (after[0] - before[0]) / max(count, 1), count


@pytest.mark.slow
def test_noisy_tenant_backlog_does_not_delay_the_quiet_tenant(base_url: str) -> None:
    """carol floods (a backlog builds in the fair queue); alice's requests skip it.

    What fair share controls is asserted exactly: alice's requests wait in the fair queue about
    nothing while carol's wait there, and her TTFT stays within 2x of solo (a queue behind carol's
    backlog would be seconds). Her TTFT p99 under load is about 1.4-1.7x solo on this 2-core box:
    the CPU engine step that is running when her request lands is about half of her solo TTFT, so a
    tighter end-to-end bound would test the box, not the router. (While the CPU engine ran the async
    loop, which hands each step's tokens out a step late, CI saw 2.07x once.) The 1.5x target
    itself is a benchmark figure (`fairlane loadtest noisy-neighbour`, docs/bench/HISTORY.md).
    """
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
        alice_before, carol_before = _queue_wait(base_url, "alice"), _queue_wait(base_url, "carol")
        loaded = _p99_rounds(base_url, prompts, 3)
        alice_after, carol_after = _queue_wait(base_url, "alice"), _queue_wait(base_url, "carol")
        queued_while_loaded = admin_state(base_url)["queued"]
    finally:
        stop.set()
        flood.join(timeout=180)
    alice_wait, alice_count = _mean_wait(alice_before, alice_after)
    carol_wait, carol_count = _mean_wait(carol_before, carol_after)
    assert queued_while_loaded > 0
    assert statuses and set(statuses) == {200}
    assert alice_count == 3 * len(prompts) and carol_count > 0
    assert alice_wait < 0.05, (alice_wait, carol_wait)  # dispatched at once, backlog or not
    assert carol_wait > 10 * max(alice_wait, 0.01), (alice_wait, carol_wait)  # the backlog waits
    assert statistics.median(loaded) <= 2.0 * statistics.median(solo), (solo, loaded)


def _long_stream(base_url: str, key: str, name: str, ends: dict[str, float], statuses: list[int]) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True}
    body["stream"] = True
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=600, headers=headers) as r:
        for _ in r.iter_lines():
            pass
        statuses.append(r.status_code)
    ends[name] = time.monotonic()


@pytest.mark.slow
def test_an_interactive_request_is_sent_past_a_room_full_of_lower_tiers(base_url: str) -> None:
    """bob (standard) and carol (batch) hold the whole room (2) with long answers; alice's request
    (interactive) is sent past it, and her answer ends while both long ones still run. Before
    displacing dispatch it waited in the fair queue for one of them to end (a 400-token answer)."""
    assert wait_until(lambda: admin_state(base_url)["in_flight"] == 0, timeout_s=120)
    ends: dict[str, float] = {}
    statuses: list[int] = []
    threads = [
        threading.Thread(target=_long_stream, args=(base_url, key, name, ends, statuses), daemon=True)
        for key, name in ((CAROL, "carol"), (BOB, "bob"))
    ]
    for t in threads:
        t.start()
    try:
        assert wait_until(lambda: admin_state(base_url)["in_flight"] == 2, timeout_s=60)
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": 4}
        r = httpx.post(
            f"{base_url}/v1/completions", json=body, timeout=120, headers={"Authorization": f"Bearer {ALICE}"}
        )
        answered = time.monotonic()
        assert r.status_code == 200, r.text
        assert not ends, ends  # neither long answer had ended when alice's did
    finally:
        for t in threads:
            t.join(timeout=600)
    assert statuses == [200, 200] and min(ends.values()) > answered
    assert admin_state(base_url)["displacing"] == 0
