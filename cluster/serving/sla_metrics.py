"""The SLA policy's inputs as Serve custom autoscaling metrics: flat ``name → float`` per replica.

Serve's ``record_autoscaling_stats`` hook returns numbers only, averaged per replica over
``look_back_period_s``. A replica reports the routers' class loads for its model (the same on every
replica: the policy averages them), its engine's running requests (summed) and its measured start
time (the policy takes the slowest). Keys: ``sla:<class>:<field>``, ``sla:<class>:<within|over>:<work
field>``, ``sla::batch``, ``sla::price``, ``replica:running``, ``replica:start_s``,
``replica:pace:<StepPace field>`` (the engine's recent back-to-back steps, summed over replicas). SLA
class names hold no ``:`` (tenancy's pattern).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from typing import Any

from cluster.serving.sla_signals import ClassLoad, StepPace, Work

RUNNING = "replica:running"
START_S = "replica:start_s"
BATCH = "sla::batch"
PRICE = "sla::price"
CLASS_FIELDS = ("tier", "ttft_target_s", "tpot_target_s", "goal", "measured_ttft_s", "measured_tpot_s")
WORK_FIELDS = tuple(f.name for f in fields(Work))
PACE_FIELDS = tuple(f.name for f in fields(StepPace))
PACE = "replica:pace:"
UNMEASURED = -1.0


def combine(payloads: Sequence[Mapping]) -> tuple[list[ClassLoad], float, float]:
    """Several routers' signals (``sla_router_signals.as_payload``) as one: work summed, measured
    latencies averaged over the routers that have them; (classes, batch, price)."""
    merged: dict[str, ClassLoad] = {}
    seen: dict[str, list[tuple[float | None, float | None]]] = {}
    for payload in payloads:
        for raw in payload["classes"]:
            c = ClassLoad(**{**raw, "within": Work(**raw["within"]), "over": Work(**raw["over"])})
            seen.setdefault(c.name, []).append((c.measured_ttft_s, c.measured_tpot_s))
            old = merged.get(c.name)
            merged[c.name] = (
                c
                if old is None
                else ClassLoad(
                    c.name,
                    c.tier,
                    c.ttft_target_s,
                    c.tpot_target_s,
                    c.goal,
                    old.within.plus(c.within),
                    old.over.plus(c.over),
                )
            )
    out = []
    for name, c in merged.items():
        ttft = [m[0] for m in seen[name] if m[0] is not None]
        tpot = [m[1] for m in seen[name] if m[1] is not None]
        out.append(
            ClassLoad(
                c.name,
                c.tier,
                c.ttft_target_s,
                c.tpot_target_s,
                c.goal,
                c.within,
                c.over,
                sum(ttft) / len(ttft) if ttft else None,
                sum(tpot) / len(tpot) if tpot else None,
            )
        )
    batch = max((float(p["batch"]) for p in payloads), default=0.0)
    price = max((float(p["price"]) for p in payloads), default=0.0)
    return out, batch, price


def flatten(
    classes: Sequence[ClassLoad],
    batch: float,
    price: float,
    running: float,
    start_s: float,
    pace: Mapping[str, float] | None = None,
) -> dict[str, float]:
    out = {RUNNING: float(running), START_S: float(start_s), BATCH: float(batch), PRICE: float(price)}
    for f in PACE_FIELDS:
        out[PACE + f] = float((pace or {}).get(f, 0.0))
    for c in classes:
        d = asdict(c)
        for f in CLASS_FIELDS:
            out[f"sla:{c.name}:{f}"] = UNMEASURED if d[f] is None else float(d[f])
        for part in ("within", "over"):
            for f in WORK_FIELDS:
                out[f"sla:{c.name}:{part}:{f}"] = float(d[part][f])
    return out


def unflatten(metrics: Mapping[str, Mapping[object, float]]) -> tuple[list[ClassLoad], dict[str, Any]]:
    """The policy's side: per-replica values → the classes (averaged over replicas) and the pool's
    figures (``running`` and ``pace`` summed, ``start_s`` the largest, ``batch`` and ``price``
    averaged)."""

    def mean(key: str) -> float | None:
        values = list(metrics.get(key, {}).values())
        return sum(values) / len(values) if values else None

    names = sorted({k.split(":")[1] for k in metrics if k.startswith("sla:") and not k.startswith("sla::")})
    classes = []
    for name in names:
        got = {f: mean(f"sla:{name}:{f}") for f in CLASS_FIELDS}
        if any(got[f] is None for f in CLASS_FIELDS):
            continue  # a class some replica has not reported yet
        parts = [
            Work(**{f: mean(f"sla:{name}:{p}:{f}") or 0.0 for f in WORK_FIELDS}) for p in ("within", "over")
        ]
        ttft, tpot = got["measured_ttft_s"], got["measured_tpot_s"]
        classes.append(
            ClassLoad(
                name,
                round(got["tier"]),
                got["ttft_target_s"],
                got["tpot_target_s"],
                got["goal"],
                *parts,
                None if ttft < 0 else ttft,
                None if tpot < 0 else tpot,
            )
        )
    starts = list(metrics.get(START_S, {}).values())
    pace = StepPace(**{f: sum(metrics.get(PACE + f, {}).values()) for f in PACE_FIELDS})
    pool = {
        "pace": pace,
        "running": sum(metrics.get(RUNNING, {}).values()),
        "start_s": max(starts) if starts else 0.0,
        "batch": mean(BATCH) or 0.0,
        "price": mean(PRICE) or 0.0,
    }
    return classes, pool
