"""Fault 6: graceful drain. What ``fairlane serve`` does on SIGTERM (``cluster.ops.local_cluster``
calls ``cluster.drain.drain``): new requests get 503 + Retry-After, in-flight streams finish."""

from __future__ import annotations

import re
import threading

import httpx

from cluster.drain import clear_drain, request_drain, wait_drained
from tenancy import DEMO_ADMIN_KEY, DEMO_KEYS
from tests.faults.fault_helpers import FAULT_APP, MODEL, wait_for

ADMIN = {"Authorization": f"Bearer {DEMO_ADMIN_KEY}"}


def _stream(url: str, out: list[str]) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count from one to fifty."}],
        "max_tokens": 40,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {DEMO_KEYS['bob']}"}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120) as r:
        out.extend(line for line in r.iter_lines() if line.startswith("data: "))


def _drain_refusals(url: str) -> float:
    """The router's own count of alice's requests refused while draining."""
    pattern = r'fairlane_rejections_total\{reason="draining",sla_class="[a-z]+",tenant="alice"\} ([0-9.]+)'
    found = re.search(pattern, httpx.get(f"{url}/metrics", headers=ADMIN).text)
    return float(found.group(1)) if found else 0.0


def test_drain_refuses_new_work_and_lets_streams_finish(fault_url: str) -> None:
    outputs: list[list[str]] = [[], []]
    threads = [threading.Thread(target=_stream, args=(fault_url, o)) for o in outputs]
    for t in threads:
        t.start()
    try:
        assert wait_for(lambda: all(o for o in outputs), timeout_s=60)  # both streams started
        counted_before = _drain_refusals(fault_url)
        refusals: list[int] = []
        request_drain(FAULT_APP)
        probe = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        headers = {"Authorization": f"Bearer {DEMO_KEYS['alice']}"}

        def refused() -> bool:
            r = httpx.post(f"{fault_url}/v1/chat/completions", json=probe, headers=headers, timeout=30)
            draining = r.status_code == 503 and r.json()["error"]["code"] == "draining"
            refusals.extend([1] if draining else [])
            return draining and "retry-after" in r.headers

        assert wait_for(refused, timeout_s=10)
        # Each refusal is counted by the server too, as a rejection (sent = completed + rejected + ...).
        assert _drain_refusals(fault_url) - counted_before == len(refusals)
        assert httpx.get(f"{fault_url}/health").json()["status"] == "draining"
        assert wait_drained(FAULT_APP, routers=1, timeout_s=60)
        for t in threads:
            t.join(timeout=60)
        assert all(o[-1] == "data: [DONE]" for o in outputs), [o[-2:] for o in outputs]
    finally:
        clear_drain(FAULT_APP)
    assert wait_for(lambda: httpx.get(f"{fault_url}/health").json()["status"] == "ok", timeout_s=10)
