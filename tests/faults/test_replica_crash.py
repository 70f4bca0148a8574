"""Fault 2: a replica actor killed under steady load from three tenants.

Requests without a token are re-dispatched (the client never notices), started streams end with
an explicit error event, every slot comes back, Serve replaces the replica and throughput recovers.
"""

from __future__ import annotations

import asyncio

import pytest

from cluster.ops.chaos_drills import replica_crash
from cluster.ops.chaos_ray import ReplicaKiller
from tests.faults.fault_helpers import FAULT_APP, assert_accounted, target


@pytest.mark.slow
def test_replica_crash_mid_stream_is_survived(fault_url: str) -> None:
    killer = ReplicaKiller(FAULT_APP)
    report = asyncio.run(
        replica_crash(target(fault_url), killer.kill, killer.recovered, warm_s=6, after_s=8, max_tokens=24)
    )
    assert_accounted(report)
    c, f = report.client, report.figures
    assert killer.killed is not None and f["recover_s"] < 120, f
    # Errors are only explicit ones from streams that had started on the dead replica.
    assert set(filter(None, f["errored_codes"].split(","))) <= {"replica_error"}, f
    assert c["errored"] <= 2 * 3, report.to_dict()  # at most the room of the dead replica (2) per tenant
    assert f["rps_after"] > 0 and c["completed"] > c["errored"], report.to_dict()
    assert report.server["retried"] == f["retried"]
