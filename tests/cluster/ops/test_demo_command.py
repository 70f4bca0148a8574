"""``fairlane demo --quick`` end to end, as a newcomer runs it: its own Ray, both dispatch policies,
the side-by-side table, and an output free of Ray's shutdown noise.

The demo runs as a subprocess (the installed entry point) so that everything it prints, Ray's C++
logs included, lands in the captured output. It starts its own Ray: ``RAY_ADDRESS`` is dropped and
the temp dir is private, as in ``tests/faults/test_drain_process.py``.

The TTFT assertion leans on what the design guarantees, not on timing luck: under ``fcfs`` a quiet
request waits in the router behind every queued request of carol's (she keeps 16 going against a
room of 8, so 8 wait, each for a slot freed by a 32-token answer); under ``fairlane`` two slots are
kept for tenants holding little, so it is dispatched at once, and the replica runs its tier first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DEMO_TIMEOUT_S = 480.0  # Ray + Serve + SmolLM2, 2 x (warm-up + 8 s of load), a redeploy, on 2 busy cores
NOISE = ("graceful_shutdown failed", "killed by `ray.kill`", "Traceback")


def _run_demo(tmp_path: Path) -> tuple[int, str, dict]:
    ray_tmp = tempfile.mkdtemp(prefix="fl-demo-", dir="/tmp")  # short: Ray's socket paths have a limit
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env |= {"RAY_TMPDIR": ray_tmp, "PYTHONPATH": str(REPO)}
    out_json = tmp_path / "demo.json"
    fairlane = str(Path(sys.executable).with_name("fairlane"))
    try:
        proc = subprocess.run(
            [fairlane, "demo", "--quick", "--json", str(out_json)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=DEMO_TIMEOUT_S,
            check=False,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    output = proc.stdout.decode("utf-8", "replace")
    body = json.loads(out_json.read_text()) if out_json.exists() else {}
    return proc.returncode, output, body


@pytest.mark.slow
@pytest.mark.own_ray  # before the session's shared Ray starts: one Ray on the box at a time
def test_demo_compares_the_policies_quietly(tmp_path: Path) -> None:
    rc, output, body = _run_demo(tmp_path)
    assert rc == 0, output[-4000:]

    # Both runs' tables, then the side-by-side table and the sentence saying what it means.
    assert "dispatch_policy=fcfs" in output and "dispatch_policy=fairlane" in output, output[-4000:]
    assert "the same load under each dispatch policy" in output, output[-4000:]
    assert "Under fcfs alice and dave wait behind carol's queue" in output, output[-4000:]
    for noise in NOISE:
        assert noise not in output, output[-4000:]

    # Every tenant was served in both runs, and the quiet tenants' TTFT p99 is well apart.
    for policy in ("fcfs", "fairlane"):
        served = {g["tenant_id"]: g["ok"] for g in body["reports"][policy]["tenants"]}
        assert all(served.get(t, 0) > 0 for t in ("alice", "dave", "carol")), (policy, served)
    fcfs, fair = body["quiet_ttft_p99_s"]["fcfs"], body["quiet_ttft_p99_s"]["fairlane"]
    assert fair * 1.5 < fcfs, body["quiet_ttft_p99_s"]
