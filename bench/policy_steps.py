"""Steps of the dispatch-policy benchmark (``bench.policy_run``) that need no state of the run."""

from __future__ import annotations

import os
import subprocess
import time

import httpx

from cluster.config import AppConfig
from loadtest.serve_process import REPO_ROOT
from tenancy import DEMO_ADMIN_KEY


def wait_idle(url: str, timeout_s: float, min_s: float = 1.0) -> dict:
    """Until the router holds nothing (``/admin/state``: no request in flight, none queued).

    A run drains its requests to their end, but one whose drain was capped ends with the rest cut by
    the client; the router drops those requests as their connections close and the replica aborts
    the running ones. The next run (the solo run after the noisy one) must start on an empty
    cluster, so it waits here rather than for a fixed time.
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


def commit() -> str | None:
    """HEAD of this checkout; a copy without .git (the device's) says so in ``FAIRLANE_COMMIT``."""
    git = ["git", "rev-parse", "HEAD"]
    try:
        got = subprocess.run(git, cwd=REPO_ROOT, capture_output=True, text=True, check=False).stdout
    except OSError:  # no git on the machine
        got = ""
    return got.strip() or os.environ.get("FAIRLANE_COMMIT")


def client_url(cfg: AppConfig, proxy_url: str) -> str:
    """Where the load goes: the proxy, or with direct ingress the router's own port (no proxy hop)."""
    if not cfg.direct_ingress:
        return proxy_url
    from cluster.ops.direct_ingress import router_urls
    from cluster.ops.local_cluster import APP_NAME

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        urls = router_urls(APP_NAME, cfg.host)
        if urls:
            return urls[0]
        time.sleep(0.5)
    raise RuntimeError("direct ingress: no router URL published")
