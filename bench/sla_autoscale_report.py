"""What an SLA-autoscaled run showed (bench/sla_autoscale_run.py): pure functions over its samples.

* **The count over time**: the policy's decisions (unique by ``decided_at``) and Serve's replica
  states, sampled by the driver; each scale-up's wait from the decision that asked for it to the
  replica serving.
* **The prediction's error**: at every decision, the attainment it predicted for a class at the
  count it chose, over its horizon (a replica's start + ``horizon_s``), against what the class's
  requests it predicts for then saw (TTFT, TPOT and E2E within the class's targets, at the client):
  those waiting for their first token when it decided and those arriving in the horizon, as the
  prediction counts them. Requests the client cut or the router refused (429) are left out, as in
  every attainment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.metrics import meets_slo
from loadtest.records import RequestRecord
from tenancy import SLAClass

MIN_REQUESTS = 10  # a decision's horizon with fewer arrivals says nothing about its prediction


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request as the prediction is judged on it: its class, its arrival and its first token
    (wall clock; None if none came), its outcome."""

    sla_class: str
    at: float
    met: bool
    first_at: float | None = None

    def waiting_at(self, t: float) -> bool:
        """Arrived before ``t`` and had no first token yet: part of the queue a decision at ``t``
        predicts for."""
        return self.at < t and (self.first_at is None or self.first_at > t)


def arrivals(
    records: Sequence[RequestRecord], started_wall: float, targets: dict[str, SLAClass]
) -> list[Arrival]:
    """The measured requests of known classes, at their scheduled arrival (wall clock)."""
    out = []
    for r in records:
        if r.cut or r.rejected or r.sla_class not in targets:
            continue
        first = None if r.first_token is None else started_wall + r.first_token
        out.append(
            Arrival(r.sla_class, started_wall + r.scheduled, meets_slo(r, targets[r.sla_class]), first)
        )
    return out


def decisions(samples: Sequence[dict]) -> list[dict]:
    """The policy's decisions in the order made, each once (the driver samples the same one often).
    Each sample's ``last_change`` counts too: a scale-up decided while a sample of ``/admin/state``
    failed is still seen, from the first answer after it. (Before 2026-12-07 every decision holding
    an infinite predicted TTFT failed ``/admin/state`` with a 400: 84 of 239 samples of that day's
    run, 90 of 319 the day before, read then as shed under the burst.)"""
    seen: dict[float, dict] = {}
    for s in samples:
        d = s.get("decision") or {}
        for one in (d.get("last_change"), d):
            if one and one.get("decided_at") is not None:
                seen.setdefault(one["decided_at"], one)
    return [seen[t] for t in sorted(seen)]


def chosen_prediction(decision: dict, sla_class: str) -> float | None:
    """The attainment the decision predicted for ``sla_class`` at the count it asked for."""
    for p in decision.get("predictions", []):
        if p.get("replicas") == decision.get("desired"):
            return p.get("attainment", {}).get(sla_class)
    return None


def horizon_s(decision: dict, start_time_s: float, horizon: float) -> float:
    """The decision's look-ahead: the replicas' measured start (the longest one published, else the
    configured start) + ``horizon_s``."""
    starts = [v for v in (decision.get("replica_start_s") or {}).values() if v]
    return (max(starts) if starts else start_time_s) + horizon


def prediction_errors(
    made: Sequence[dict], seen: Sequence[Arrival], sla_class: str, start_time_s: float, horizon: float
) -> list[dict]:
    """Per decision with enough arrivals in its horizon: predicted, observed and their difference."""
    rows = []
    own = [a for a in seen if a.sla_class == sla_class]
    for d in made:
        predicted = chosen_prediction(d, sla_class)
        if predicted is None:
            continue
        t0 = d["decided_at"]
        t1 = t0 + horizon_s(d, start_time_s, horizon)
        window = [a for a in own if t0 <= a.at < t1 or a.waiting_at(t0)]
        if len(window) < MIN_REQUESTS:
            continue
        observed = sum(a.met for a in window) / len(window)
        rows.append(
            {
                "decided_at": t0,
                "desired": d.get("desired"),
                "current": d.get("current"),
                "predicted": predicted,
                "observed": observed,
                "error": predicted - observed,
                "requests": len(window),
            }
        )
    return rows


def error_summary(rows: Sequence[dict]) -> dict:
    """Mean absolute and mean signed error (predicted − observed; > 0: the policy was optimistic)."""
    if not rows:
        return {"decisions": 0, "mean_abs_error": None, "mean_error": None, "max_abs_error": None}
    errors = [r["error"] for r in rows]
    return {
        "decisions": len(rows),
        "mean_abs_error": sum(abs(e) for e in errors) / len(errors),
        "mean_error": sum(errors) / len(errors),
        "max_abs_error": max(abs(e) for e in errors),
    }


def error_by_phase(rows: Sequence[dict], phases: dict[str, tuple[float, float]]) -> dict[str, dict]:
    """``error_summary`` of the decisions made in each phase: a decision before a burst is judged on
    a horizon the burst falls in, which no trend it could see foretold."""
    return {
        name: error_summary([r for r in rows if t0 <= r["decided_at"] < t1])
        for name, (t0, t1) in phases.items()
    }


def count_changes(made: Sequence[dict]) -> list[dict]:
    """The decisions that moved the count: when, from what, to what, and why. Serve's delay makes the
    policy repeat a change until it applies; only the first of such a run is kept."""
    out: list[dict] = []
    for d in made:
        if d.get("desired") == d.get("current"):
            continue
        change = {k: d.get(k) for k in ("decided_at", "current", "desired", "reason")}
        if out and (out[-1]["current"], out[-1]["desired"]) == (change["current"], change["desired"]):
            continue
        out.append(change)
    return out


def running_timeline(samples: Sequence[dict]) -> list[tuple[float, int]]:
    """(time, replicas RUNNING) at each change of Serve's count."""
    out: list[tuple[float, int]] = []
    for s in samples:
        n = s.get("running")
        if n is not None and (not out or out[-1][1] != n):
            out.append((s["t"], n))
    return out


def scale_up_waits(changes: Sequence[dict], timeline: Sequence[tuple[float, int]]) -> list[dict]:
    """For each decision asking for more replicas: seconds until Serve ran that many."""
    out = []
    for c in changes:
        if c["desired"] <= c["current"]:
            continue
        ready = next((t for t, n in timeline if t >= c["decided_at"] and n >= c["desired"]), None)
        out.append(
            {
                "decided_at": c["decided_at"],
                "to": c["desired"],
                "ready_after_s": None if ready is None else ready - c["decided_at"],
            }
        )
    return out


def phase_attainment(seen: Sequence[Arrival], phases: dict[str, tuple[float, float]], sla_class: str) -> dict:
    """Attainment of ``sla_class`` per phase (wall-clock spans), with its request count."""
    out = {}
    for name, (t0, t1) in phases.items():
        window = [a for a in seen if a.sla_class == sla_class and t0 <= a.at < t1]
        out[name] = {
            "requests": len(window),
            "attainment": sum(a.met for a in window) / len(window) if window else None,
        }
    return out
