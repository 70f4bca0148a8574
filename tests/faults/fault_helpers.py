"""Names, keys and small checks shared by the fault tests."""

from __future__ import annotations

import glob
import json
import os
import time

import ray

from cluster.ops.chaos_drills import DrillReport, Target
from tenancy import DEMO_ADMIN_KEY, DEMO_KEY_SALT, DEMO_KEYS, hash_api_key

FAULT_APP, FAULT_PREFIX = "fl-faults", "/faults"
FUZZ_KEY = "sk-test-fuzz-5f1c"
# The Redis outage test pushes this tenant past its RPM; 10 keeps that true on a slow, loaded box.
METERED_KEY, METERED_RPM = "sk-test-metered-9a2e", 10
MODEL = "smollm2-135m"


def metered_tenant() -> dict:
    """A tenant with a requests-per-minute quota the outage test's load exceeds several times.

    Its class is batch, the lowest tier. Its quota hands it a burst of 10 at the drill's start and
    again when Redis comes back empty. As a standard-tier tenant that burst went ahead of the steady
    batch tenant (carol), whose request then waited behind up to nine others on a router with one
    slot: 5.3 s alone, 31 s in a full suite run (the router's timings). That is tier order at work,
    not Redis, and it landed inside or outside the outage window by chance. In the batch tier the
    burst shares fairly with carol's requests and waits behind the other tiers."""
    tenant = fuzz_tenant() | {"id": "metered", "display_name": "metered", "sla_class": "batch"}
    tenant["api_key_hashes"] = [hash_api_key(METERED_KEY, DEMO_KEY_SALT)]
    tenant["quotas"] = tenant["quotas"] | {"requests_per_minute": METERED_RPM, "max_tokens_per_request": 16}
    return tenant


def fuzz_tenant() -> dict:
    """Tiny per-request limits: a fuzzed valid request runs at most 4 tokens on a short prompt."""
    return {
        "id": "fuzz",
        "display_name": "fuzz",
        "api_key_hashes": [hash_api_key(FUZZ_KEY, DEMO_KEY_SALT)],
        "weight": 1.0,
        "sla_class": "standard",
        "quotas": {
            "requests_per_minute": 100_000,
            "tokens_per_minute": 10_000_000,
            "max_concurrent_requests": 64,
            "max_tokens_per_request": 4,
            "max_context_length": 256,
        },
    }


def target(base_url: str, routers: int = 1) -> Target:
    keys = {t: DEMO_KEYS[t] for t in ("alice", "bob", "carol")}
    return Target(base_url, keys, DEMO_ADMIN_KEY, MODEL, routers)


def assert_accounted(report: DrillReport) -> None:
    """Nothing lost, nothing counted twice: the client's endings add up and match the server's."""
    c, s = report.client, report.server
    assert c["sent"] == c["completed"] + c["rejected"] + c["errored"] + c["aborted"], c
    assert s["sent"] == c["sent"], (c, s)
    assert report.balanced, (c, s)
    out = os.environ.get("FAIRLANE_FAULTS_JSON")  # figures for BENCHMARKS.md, when asked for
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write(json.dumps(report.to_dict()) + "\n")


def serve_logs(app: str) -> list[str]:
    """Serve's log files of ``app``'s routers and replicas in this Ray session."""
    session = ray._private.worker._global_node.get_session_dir_path()
    return sorted(glob.glob(os.path.join(session, "logs", "serve", f"replica_{app}_*.log")))


def log_text_since(paths: list[str], offsets: dict[str, int]) -> str:
    """What the files gained since ``offsets`` (file sizes taken earlier)."""
    out = []
    for p in paths:
        with open(p, encoding="utf-8", errors="replace") as f:
            f.seek(offsets.get(p, 0))
            out.append(f.read())
    return "\n".join(out)


def log_offsets(paths: list[str]) -> dict[str, int]:
    return {p: os.path.getsize(p) for p in paths}


def wait_for(predicate, timeout_s: float = 30.0, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())
