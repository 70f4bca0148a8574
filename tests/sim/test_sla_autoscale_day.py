"""``fairlane simulate-autoscale`` on a small day: the SLA policy, Serve's count policy and fixed
provisioning on one trace (loadtest/sim/autoscale_day.py)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from rich.console import Console

from loadtest.sim.autoscale_day import DaySpec, claims, profile
from loadtest.sim.cli import run_autoscale_cli

SMALL = DaySpec(tenants=40, bound=6, day_s=400.0, initial=2, count_targets=(8.0,), start_s=20.0)


def test_the_day_is_ten_to_one_with_two_threefold_flash_crowds() -> None:
    spec = DaySpec()
    rate = profile(spec)
    t = np.linspace(0, spec.day_s, 24001)
    plain = DaySpec(flash_factor=1.0)
    diurnal = profile(plain)(t)
    assert diurnal.max() / diurnal.min() == pytest.approx(10.0, rel=1e-3)
    flash = rate(t) / diurnal
    assert flash.max() == pytest.approx(3.0)
    rising = (t >= 0.15 * spec.day_s) & (t <= 0.15 * spec.day_s + spec.flash_rise_s)
    assert flash[rising][-1] == pytest.approx(3.0) and flash[rising][0] == pytest.approx(1.0)
    assert (np.diff((flash > 2.99).astype(int)) == 1).sum() == 2  # two crowds


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("day") / "day.json"
    report = run_autoscale_cli(SMALL, out, Console(file=io.StringIO()))
    assert json.loads(out.read_text())["claims"] == report["claims"]
    return report


def test_every_policy_runs_on_one_trace(report: dict) -> None:
    rows = report["policies"]
    assert set(rows) == {"sla", "count@8", "fixed"}
    assert len({r["classes"]["interactive"]["offered"] for r in rows.values()}) == 1
    for r in rows.values():
        assert 0 < r["peak_replicas"] <= SMALL.bound
        assert r["dollars"] == pytest.approx(r["replica_hours"] * SMALL.price)
        assert r["dollars_per_success"] == pytest.approx(r["dollars"] / r["ok"])
    fixed = rows["fixed"]
    assert set(fixed["replicas_every_30s"]) == {SMALL.bound}
    assert rows["sla"]["replica_hours"] < fixed["replica_hours"]  # it scales down from the peak
    assert sum(rows["sla"]["decision_reasons"].values()) > 0


def test_the_claim_compares_with_the_count_policy_that_reaches_the_same_attainment() -> None:
    def row(att: float, hours: float) -> dict:
        return {"interactive_within_share": att, "replica_hours": hours}

    rows = {
        "sla": row(0.995, 6.0),
        "count@4": row(0.999, 10.0),
        "count@8": row(0.996, 9.0),
        "count@16": row(0.90, 5.0),
    }
    c = claims(rows, 0.99)
    assert c["reference_count_policy"] == "count@8" and c["replica_hours_ratio"] == pytest.approx(6 / 9)
    assert c["target_met"]
    rows["count@8"] = row(0.99, 9.0)
    rows["count@4"] = row(0.99, 10.0)
    c = claims(rows, 0.99)  # none reaches it: the best one is the reference
    assert not c["reference_reaches_sla_attainment"] and c["reference_count_policy"] in ("count@4", "count@8")
