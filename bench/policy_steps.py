"""Steps of the dispatch-policy benchmark (``bench.policy_run``) that need no state of the run."""

from __future__ import annotations

import time

import httpx

from tenancy import DEMO_ADMIN_KEY


def wait_idle(url: str, timeout_s: float, min_s: float = 1.0) -> dict:
    """Until the router holds nothing (``/admin/state``: no request in flight, none queued).

    A run ends with its backlog cancelled by the client; the router drops those requests as their
    connections close and the replica aborts the running ones. The next run (the solo run after
    the noisy one) must start on an empty cluster, so it waits here rather than for a fixed time.
    Returns the seconds waited and the last state's ``in_flight`` and ``queued`` (None if unread).
    """
    t0 = time.monotonic()
    time.sleep(min_s)
    last: dict = {}
    headers = {"Authorization": f"Bearer {DEMO_ADMIN_KEY}"}
    while time.monotonic() - t0 < timeout_s:
        try:
            last = httpx.get(f"{url}/admin/state", headers=headers, timeout=5.0).json()
        except (httpx.HTTPError, ValueError):
            last = {}
        if last.get("in_flight") == 0 and last.get("queued") == 0:
            break
        time.sleep(0.5)
    return {
        "waited_s": time.monotonic() - t0,
        "in_flight": last.get("in_flight"),
        "queued": last.get("queued"),
    }
