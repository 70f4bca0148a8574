"""Helpers: tiny hand-built traces and tenancy configs for the simulator tests."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest.sim.step_model import StepModel
from loadtest.sim.workload import SimTenant, Trace
from tenancy import Quotas, SLAClass, TenancyConfig, Tenant, hash_api_key

SALT = "sim-test-salt-0123456789"

CLASSES = (
    SLAClass(
        name="interactive",
        priority_tier=0,
        ttft_target_s=1.0,
        tpot_target_s=0.1,
        e2e_target_s=30,
        may_preempt_lower_tiers=True,
    ),
    SLAClass(name="batch", priority_tier=2, ttft_target_s=60.0, tpot_target_s=1.0, e2e_target_s=3600),
)


def make_trace(rows: list[tuple[float, int, int, int]], tenants: list[tuple[str, str, float]]) -> Trace:
    """rows: (arrival, tenant index, prompt, output tokens); tenants: (id, class, weight)."""
    rows = sorted(rows, key=lambda r: r[0])
    sim_tenants = tuple(SimTenant(tid, cls, w, 1.0, tid, 4096) for tid, cls, w in tenants)
    arr = np.array([r[0] for r in rows], dtype=float)
    col = [np.array([r[k] for r in rows], dtype=np.int32) for k in (1, 2, 3)]
    return Trace(sim_tenants, arr, *col, duration_s=float(arr[-1]) if len(arr) else 0.0, capacity_rps=1.0)


def make_config(tenants: list[tuple[str, str, float]], rpm: int = 100_000) -> TenancyConfig:
    quotas = Quotas(
        requests_per_minute=rpm,
        tokens_per_minute=10**9,
        max_concurrent_requests=10_000,
        max_tokens_per_request=8192,
        max_context_length=16384,
    )
    return TenancyConfig(
        sla_classes=CLASSES,
        tenants=tuple(
            Tenant(
                id=t,
                display_name=t,
                api_key_hashes=(hash_api_key(f"k-{t}", SALT),),
                weight=w,
                sla_class=c,
                quotas=quotas,
            )
            for t, c, w in tenants
        ),
        key_salt=SALT,
        admin_key_hash=hash_api_key("admin", SALT),
    )


@pytest.fixture
def flat_10ms() -> StepModel:
    """Every step takes 10 ms whatever the batch: times are easy to compute by hand."""
    return StepModel(10.0, 0.0, 0.0, 0.0, "flat-10ms")
