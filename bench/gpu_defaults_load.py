"""The two loads of ``bench.gpu_defaults``: the quiet tenant alone, then beside a noisy flood.

The quiet tenant is alice (interactive), the noisy one carol (batch), both with the load
generator's sampling mix, Poisson arrivals and seeded prompts, so each variant gets the same trace.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import httpx

from loadtest.capacity import delivered_tps
from loadtest.metrics import errors_by_type, itls, percentiles, ttft
from loadtest.records import RequestRecord
from loadtest.runner import run_scenario
from loadtest.scenario import Scenario
from tenancy import DEMO_ADMIN_KEY

QUIET_KEY, NOISY_KEY = "sk-fairlane-alice", "sk-fairlane-carol"
ADMIN = {"Authorization": f"Bearer {DEMO_ADMIN_KEY}"}


@dataclass(frozen=True)
class Trace:
    """Rates, lengths and durations of the two loads."""

    quiet_rate: float
    quiet_tokens: int
    noisy_rate: float
    noisy_tokens: int
    solo_s: float
    flood_s: float
    warmup_s: float
    client_procs: int
    variant_estimate_s: float  # a variant's start, both loads and its stop: skipped below this

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {QUIET_KEY}"}

    def describe(self) -> dict:
        return asdict(self) | {"arrivals": "poisson", "sampling": "mix", "prompts": "bundled chat prompts"}


GPU = Trace(2.0, 64, 70.0, 256, 25.0, 60.0, 10.0, 4, 200.0)
SMOKE = Trace(0.5, 32, 3.0, 48, 20.0, 30.0, 5.0, 1, 150.0)


def trace_for(smoke: bool) -> Trace:
    return SMOKE if smoke else GPU


def scenario(model: str, trace: Trace, flood: bool) -> Scenario:
    quiet = {
        "id": "alice", "api_key": QUIET_KEY, "sla_class": "interactive", "weight": 2.0,
        "rate": trace.quiet_rate, "output": {"kind": "fixed", "tokens": trace.quiet_tokens},
    }  # fmt: skip
    noisy = {
        "id": "carol", "api_key": NOISY_KEY, "sla_class": "batch", "weight": 1.0,
        "rate": trace.noisy_rate, "output": {"kind": "fixed", "tokens": trace.noisy_tokens},
    }  # fmt: skip
    duration = trace.flood_s if flood else trace.solo_s
    return Scenario.model_validate(
        {
            "name": "gpu-defaults-flood" if flood else "gpu-defaults-solo",
            "model": model,
            "duration_s": duration,
            "warmup_s": trace.warmup_s,
            "seed": 49,
            "max_requests": 20_000,
            "max_in_flight": 4096,
            "client_procs": trace.client_procs if flood else 1,
            "request_timeout_s": 120.0,
            # The noisy backlog left at the end is the replica's capacity at work, not a measurement:
            # throughput counts the tokens received inside the load's window, so it is cut after 10 s.
            "drain_timeout_s": 10.0,
            "tenants": [quiet, noisy] if flood else [quiet],
        }
    )


def measure(url: str, model: str, trace: Trace) -> dict:
    """Solo, then flood, on the running cluster at ``url``."""
    out = {}
    for phase, flood in (("solo", False), ("flood", True)):
        httpx.post(f"{url}/admin/timings/reset", headers=ADMIN, timeout=10)
        run = run_scenario(scenario(model, trace, flood), url, admin_key=DEMO_ADMIN_KEY, show_progress=False)
        timings = httpx.get(f"{url}/admin/timings", headers=ADMIN, timeout=30).json()["records"]
        out[phase] = phase_figures(run.records, timings, run.client_loop_lag)
    return out


def phase_figures(records: list[RequestRecord], timings: list[dict], loop_lag: dict) -> dict:
    measured = [r for r in records if not r.warmup]
    quiet = [r for r in measured if r.tenant == "alice" and r.ok]
    noisy = [r for r in records if r.tenant == "carol"]
    router_quiet = [t for t in timings if t["tenant_id"] == "alice" and t.get("tpot") is not None]
    return {
        "quiet_requests": len(quiet),
        "quiet_failed": sum(1 for r in measured if r.tenant == "alice" and not r.ok and not r.cut),
        "quiet_cut": sum(1 for r in measured if r.tenant == "alice" and r.cut),
        "quiet_ttft": percentiles([v for r in quiet if (v := ttft(r)) is not None]),
        "quiet_itl": percentiles([gap for r in quiet for gap in itls(r)]),
        "router_tpot": percentiles([t["tpot"] for t in router_quiet]),
        "router_ttft": percentiles([t["ttft"] for t in router_quiet if t.get("ttft") is not None]),
        "noisy_tps": delivered_tps(noisy) if noisy else 0.0,
        "noisy_requests": len(noisy),
        "noisy_ok": sum(r.ok for r in noisy),
        "client_loop_lag_ms": loop_lag,
        "errors": errors_by_type(records),
    }
