"""A tenant's own SLA report from a router's memory (the ledger off, or away) shows its own usage and
cost only (issue 43): the seconds its requests held their slots, priced as the ledger prices a row,
never the cluster's replica-seconds, which hold every tenant's use and the idle time. The admin's
report keeps the cluster's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from cluster.edge import ledger_views
from cluster.ledger.rows import Pricing, row_from_timing
from cluster.telemetry.request_timing import RequestTiming, TimingRecorder
from tenancy import default_tenancy_config

CONFIG = default_tenancy_config()  # $5 per GPU-hour
ROOM = 4
PRICING = Pricing(CONFIG.gpu_dollars_per_hour, ROOM)
CLUSTER_SECONDS = 36_000.0  # ten replica-hours: every tenant's use and the idle time


def _request(i: int, tenant: str, held_s: float, outcome: str = "ok") -> RequestTiming:
    t = RequestTiming(f"{tenant}-{i}", tenant, CONFIG.tenants_by_id[tenant].sla_class, 1000.0 + i, model="m")
    t.prompt_tokens, t.outcome = 10, outcome  # type: ignore[assignment]
    if outcome == "rejected":
        t.end = t.arrival  # refused before dispatch: no slot held
        return t
    t.admitted, t.dispatched = t.arrival, t.arrival + 0.5
    t.first_token, t.end = t.dispatched + 0.1, t.dispatched + held_s
    t.output_tokens = 20
    return t


def _recorder() -> tuple[TimingRecorder, list[RequestTiming]]:
    """alice: two short requests and one refused; carol: 200 long ones, far more of everything."""
    recorder = TimingRecorder()
    mine = [_request(0, "alice", 2.0), _request(1, "alice", 4.0), _request(2, "alice", 0.0, "rejected")]
    for t in mine + [_request(i, "carol", 60.0) for i in range(200)]:
        recorder.add(t)
    recorder.replica_seconds = CLUSTER_SECONDS
    recorder.model_replica_seconds = {"m": CLUSTER_SECONDS}
    return recorder, mine


def _core(recorder: TimingRecorder) -> Any:
    """What the views read of the router: its recorder, tenancy and each model's room."""
    pool = SimpleNamespace(dispatcher=SimpleNamespace(room=ROOM))
    return SimpleNamespace(recorder=recorder, tenancy=SimpleNamespace(config=CONFIG), pools={"m": pool})


class _AwayLedger:
    """A ledger whose database does not answer: the view answers from memory."""

    app, router, state = "app", "r1", "spilling"

    def __init__(self) -> None:
        self.writer = SimpleNamespace(flush=self._flush)

    async def _flush(self) -> None:
        return None

    async def query(self, work: Any) -> Any:
        raise ConnectionRefusedError("database away")


async def _report(ledger: Any, core: Any, tenant_id: str | None) -> dict:
    answer = await ledger_views.sla(ledger, core, {}, tenant_id)
    assert answer.status_code == 200
    return orjson.loads(answer.body)


@pytest.mark.parametrize("ledger", ["off", "away"])
async def test_a_tenants_report_holds_its_own_cost_never_the_clusters(ledger: str) -> None:
    recorder, mine = _recorder()
    core = _core(recorder)
    away = _AwayLedger() if ledger == "away" else None
    report = await _report(away, core, "alice")
    assert report["source"] == "memory"
    # The ledger's price of alice's rows: (end - dispatched) / room replica-seconds each, $5 an hour.
    rows = [row_from_timing(t, "app", "r1", PRICING) for t in mine]
    seconds, dollars = sum(r.replica_seconds for r in rows), sum(r.cost_usd for r in rows)
    assert seconds == pytest.approx((2.0 + 4.0) / ROOM)
    assert report["replica_seconds"] == pytest.approx(seconds)
    assert report["gpu_dollars"] == pytest.approx(dollars)
    [alice] = report["tenants"]
    assert alice["tenant_id"] == "alice" and alice["ok"] == 2
    assert alice["dollars_per_success"] == pytest.approx(dollars / 2)
    assert [c["requests"] for c in report["classes"]] == [3]
    assert report["models"] == [] and report["model_replica_seconds"] == {}
    assert CLUSTER_SECONDS not in _numbers(report)  # the cluster's figure appears nowhere


async def test_the_heavy_tenant_pays_for_its_own_use_and_the_admin_sees_the_cluster() -> None:
    recorder, _ = _recorder()
    core = _core(recorder)
    alice, carol = await _report(None, core, "alice"), await _report(None, core, "carol")
    assert carol["replica_seconds"] == pytest.approx(200 * 60.0 / ROOM)
    assert carol["gpu_dollars"] == pytest.approx(200 * 60.0 / ROOM * 5.0 / 3600)
    assert carol["replica_seconds"] > 1000 * alice["replica_seconds"]  # each its own, not a share
    admin = await _report(None, core, None)
    assert admin["replica_seconds"] == CLUSTER_SECONDS
    assert admin["gpu_dollars"] == pytest.approx(CLUSTER_SECONDS * 5.0 / 3600)
    assert admin["model_replica_seconds"] == {"m": CLUSTER_SECONDS}
    assert [t["tenant_id"] for t in admin["tenants"]] == ["alice", "carol"]


def _numbers(value: Any) -> list[float]:
    """Every number in a JSON value."""
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return [value] if isinstance(value, int | float) and not isinstance(value, bool) else []
