"""Issue 23's targets for the dispatch-policy benchmark (``bench.policy_run``): figures and verdicts.

From each run's load-generator summary (``loadtest.summary``):

* noisy neighbour at 1.5× capacity: (a) the quiet tenants' TTFT p99 (their requests pooled) ≤ 1.25 ×
  that of the solo run (the same quiet arrivals, noisy tenants removed, under ``fairlane``);
  (b) interactive TTFT attainment ≥ 99% over the interactive tenants within their fair share;
  (c) Jain's index ≥ 0.99 per window among the backlogged tenants of a (class, weight) group whose
  tenants are all over their share (they have work waiting throughout; a within-share tenant's
  outstanding requests follow its own arrivals, so its windows differ by demand): mean and minimum.
* mixed-sla at 1.5× capacity: interactive SLA attainment ≥ 99%, and the batch class absorbs the
  loss (its attainment at or below the interactive class's). Attainment here is over requests
  offered (``attainment_all``: a refused request misses).

Every run drains its requests to their end (``loadtest/drain.py``); a request the drain's cap still
cut has no verdict and is in no attainment: its count is printed beside them (``cut``). Beside the
TTFT target the rows give TPOT attainment and the whole SLA (TTFT, TPOT and E2E) apart.

Every policy's figures are computed alike; the verdicts that the issue asks of ``fairlane`` are
printed beside ``vtc``'s and ``fcfs``'s for comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from loadtest.agreement import server_request_id
from loadtest.metrics import percentiles, ttft
from loadtest.records import RequestRecord

TTFT_RATIO_MAX = 1.25
ATTAINMENT_MIN = 0.99
JAIN_MIN = 0.99


@dataclass(frozen=True, slots=True)
class Row:
    """One figure across policies: ``values[policy]`` and, for a target, ``met[policy]``."""

    scenario: str
    label: str
    target: str  # "" for a figure shown for context
    unit: str  # "s", "%", "x", "j" (an index), "tps", "n" (a count)
    values: dict[str, float | None] = field(default_factory=dict)
    met: dict[str, bool | None] = field(default_factory=dict)


def quiet_ttft_p99(records: Sequence[RequestRecord], quiet: Sequence[str]) -> float | None:
    """TTFT p99 of the quiet tenants' measured successful requests, pooled."""
    xs = [v for r in records if r.tenant in quiet and r.ok and not r.warmup if (v := ttft(r)) is not None]
    return percentiles(xs, (99,))["p99"]


def quiet_split(records: Sequence[RequestRecord], server_timings: dict | None, quiet: Sequence[str]) -> dict:
    """Where the quiet tenants' TTFT goes, p50 and p99 of each part, per request matched by response
    id between the client's records and the router's timing records:

    * ``router_ttft``: the router's own (arrival → first token);
    * ``client_extra``: client TTFT − router TTFT (the HTTP path both ways, the client's own loop);
    * and, where the router recorded them: ``entry`` (its app's entry → arrival: parsing, auth,
      templating, tokenizing and the loop's waits between), ``queue`` (arrival → dispatch, the fair
      queue included), ``engine_ttft`` (the engine's arrival → first token, its own clock) and
      ``transit`` (dispatch → first token at the router, less ``engine_ttft``: both hops and the
      replica's intake and flush)."""
    server = {t["request_id"]: t for t in (server_timings or {}).get("records", [])}
    names = ("router_ttft", "client_extra", "entry", "queue", "engine_ttft", "transit")
    parts: dict[str, list[float]] = {k: [] for k in names}
    for r in records:
        if r.tenant not in quiet or not r.ok or r.warmup:
            continue
        match = server.get(server_request_id(r.server_id) or "")
        mine = ttft(r)
        if match is None or match.get("ttft") is None or mine is None:
            continue
        parts["router_ttft"].append(match["ttft"])
        parts["client_extra"].append(mine - match["ttft"])
        for name, value in _stages(match).items():
            if value is not None:
                parts[name].append(value)
    out: dict = {"matched": len(parts["router_ttft"])}
    for name, xs in parts.items():
        p = percentiles(xs, (50, 99))
        out[f"{name}_p50_s"], out[f"{name}_p99_s"] = p["p50"], p["p99"]
    return out


def _stages(t: dict) -> dict[str, float | None]:
    def since(a: str, b: str) -> float | None:
        return None if t.get(a) is None or t.get(b) is None else t[b] - t[a]

    to_first = since("dispatched", "first_token")
    engine = t.get("engine_ttft")
    return {
        "entry": since("received", "arrival"),
        "queue": since("arrival", "dispatched"),
        "engine_ttft": engine,
        "transit": None if to_first is None or engine is None else to_first - engine,
    }


def compact(summary: dict) -> dict:
    """The summary's figures without its per-window arrays (those stay in the run's folder)."""
    keep = ("meta", "requests_total", "requests_measured", "overall", "tenants", "classes",
            "fair_share", "attainment_by_share", "errors", "cost")  # fmt: skip
    f = summary["fairness"]
    fairness = {k: v for k, v in f.items() if k not in ("edges", "service", "backlogged")}
    return {k: summary[k] for k in keep if k in summary} | {"fairness": fairness}


def _ge(v: float | None, bound: float) -> bool | None:
    return None if v is None else v >= bound


def over_share_jain(run: dict) -> tuple[float | None, float | None]:
    """Jain mean and minimum over the groups whose tenants are all over their fair share."""
    within = {t: v["within_share"] for t, v in run["fair_share"]["tenants"].items()}
    groups = run["fairness"].get("groups", {}).values()
    groups = [g for g in groups if not any(within.get(t, True) for t in g["tenants"])]
    means = [g["jain_mean"] for g in groups if g["jain_mean"] is not None]
    mins = [g["jain_min"] for g in groups if g["jain_min"] is not None]
    return (min(means) if means else None, min(mins) if mins else None)


def replica_profile_mean(meta: dict, key: str) -> float | None:
    """A step-profile figure averaged over the replicas (a per-step field's mean, or a fraction)."""
    values = []
    for profile in (meta.get("replica_profiles") or {}).values():
        value = profile.get(key)
        values.append(value.get("mean") if isinstance(value, dict) else value)
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def within_ttft_attainment(run: dict, cls: str = "interactive") -> float | None:
    return within_figure(run, "ttft_attainment", cls)


def within_figure(run: dict, key: str, cls: str = "interactive") -> float | None:
    """A figure of the class's within-share side (``attainment_by_share``); None where it is absent."""
    side = run.get("attainment_by_share", {}).get(cls, {}).get("within")
    return None if side is None else side.get(key)


def drain_rows(name: str, runs: dict[str, dict]) -> list[Row]:
    """How each run ended: requests cut by the drain's cap (in no attainment) and the drain's length."""
    cut = Row(name, "requests cut by the client's deadline (in no attainment)", "", "n")
    waited = Row(name, "drain after the load (every admitted request to its end)", "", "s")
    for policy, run in runs.items():
        cut.values[policy] = run.get("overall", {}).get("cut")
        waited.values[policy] = (run.get("meta", {}).get("drain") or {}).get("waited_s")
    return [cut, waited]


def noisy_rows(name: str, runs: dict[str, dict], solo_p99: float | None) -> list[Row]:
    """Targets (a)-(c) per policy; ``runs[policy]`` is ``compact(summary)`` + ``quiet_ttft_p99_s``."""
    p99 = Row(name, "quiet tenants' TTFT p99", "", "s")
    ratio = Row(name, "quiet TTFT p99 ÷ solo", f"≤ {TTFT_RATIO_MAX:g}×", "x")
    att = Row(name, "interactive TTFT attainment, within share", f"≥ {ATTAINMENT_MIN:.0%}", "%")
    att_tpot = Row(name, "interactive TPOT attainment, within share", "", "%")
    att_sla = Row(name, "interactive whole SLA (TTFT, TPOT, E2E) attainment, within share", "", "%")
    within_cut = Row(name, "interactive within share: cut (in none of the three)", "", "n")
    jmean = Row(name, "Jain, backlogged over-share group (mean)", f"≥ {JAIN_MIN:g}", "j")
    jmin = Row(name, "Jain, backlogged over-share group (min)", f"≥ {JAIN_MIN:g}", "j")
    jall = Row(name, "Jain, every group of ≥ 2 incl. within-share (mean)", "", "j")
    client = Row(name, "load generator's loop lag p99 (its latencies grow with it)", "", "ms")
    router = Row(name, "router's loop lag p99", "", "ms")
    at_router = Row(name, "quiet TTFT p99 at the router (arrival → first token)", "", "s")
    extra50 = Row(name, "quiet: client TTFT − router TTFT, p50", "", "s")
    extra99 = Row(name, "quiet: client TTFT − router TTFT, p99", "", "s")
    stages = {
        part: Row(name, f"quiet p99: {label}", "", "s")
        for part, label in (
            ("entry", "router app entry → arrival"),
            ("queue", "arrival → dispatch"),
            ("engine_ttft", "engine arrival → first token"),
            ("transit", "dispatch → first token, less the engine's"),
        )
    }
    gc_router = Row(name, "router's longest GC pause", "", "ms")
    gc_client = Row(name, "load generator's longest GC pause", "", "ms")
    gc_replica = Row(name, "replicas' longest GC pause (since start)", "", "ms")
    engine = {
        key: Row(name, f"replicas' step profile (last polled): {label}", "", unit)
        for key, label, unit in (
            ("device_busy_fraction", "device busy", "%"),
            ("hold_ms", "held for arrivals per step, mean (late launch)", "ms"),
            ("gap_ms", "device idle before a step, mean", "ms"),
        )
    }
    rows = [p99, ratio, att, att_tpot, att_sla, within_cut, jmean, jmin, jall, at_router, extra50, extra99,
            *stages.values(), client, router, gc_client, gc_router, gc_replica, *engine.values()]  # fmt: skip
    for policy, run in runs.items():
        q = run.get("quiet_ttft_p99_s")
        p99.values[policy] = q
        r = None if q is None or not solo_p99 else q / solo_p99
        ratio.values[policy], ratio.met[policy] = r, None if r is None else r <= TTFT_RATIO_MAX
        a = within_ttft_attainment(run)
        att.values[policy], att.met[policy] = a, _ge(a, ATTAINMENT_MIN)
        att_tpot.values[policy] = within_figure(run, "tpot_attainment")
        att_sla.values[policy] = within_figure(run, "attainment_all")
        within_cut.values[policy] = within_figure(run, "cut")
        mean, least = over_share_jain(run)
        jmean.values[policy], jmean.met[policy] = mean, _ge(mean, JAIN_MIN)
        jmin.values[policy], jmin.met[policy] = least, _ge(least, JAIN_MIN)
        jall.values[policy] = run["fairness"].get("jain_backlogged_mean")
        meta = run.get("meta", {})
        client.values[policy] = (meta.get("client_loop_lag_ms") or {}).get("p99_ms")
        router.values[policy] = (meta.get("router_loop_lag_ms") or {}).get("p99_ms")
        split = run.get("quiet_split") or {}
        at_router.values[policy] = split.get("router_ttft_p99_s")
        extra50.values[policy] = split.get("client_extra_p50_s")
        extra99.values[policy] = split.get("client_extra_p99_s")
        for part, row in stages.items():
            row.values[policy] = split.get(f"{part}_p99_s")
        gc_client.values[policy] = (meta.get("client_gc") or {}).get("max_ms")
        gc_router.values[policy] = (meta.get("router_gc") or {}).get("max_ms")
        replicas = [g.get("max_ms", 0.0) for g in (meta.get("replica_gc") or {}).values()]
        gc_replica.values[policy] = max(replicas) if replicas else None
        for key, row in engine.items():
            row.values[policy] = replica_profile_mean(meta, key)
    return [*rows, *drain_rows(name, runs), *tenant_rows(name, runs)]


def mixed_rows(name: str, runs: dict[str, dict]) -> list[Row]:
    inter = Row(name, "interactive SLA attainment", f"≥ {ATTAINMENT_MIN:.0%}", "%")
    inter_ttft = Row(name, "interactive TTFT attainment", "", "%")
    inter_tpot = Row(name, "interactive TPOT attainment", "", "%")
    batch = Row(name, "batch SLA attainment", "", "%")
    absorbs = Row(name, "batch absorbs the loss (interactive met, batch ≤ interactive)", "yes", "")
    for policy, run in runs.items():
        classes = run["classes"]
        i = classes.get("interactive", {}).get("attainment_all")
        b = classes.get("batch", {}).get("attainment_all")
        inter.values[policy], inter.met[policy] = i, _ge(i, ATTAINMENT_MIN)
        inter_ttft.values[policy] = classes.get("interactive", {}).get("ttft_attainment")
        inter_tpot.values[policy] = classes.get("interactive", {}).get("tpot_attainment")
        batch.values[policy] = b
        ok = None if i is None or b is None else i >= ATTAINMENT_MIN and b <= i
        absorbs.met[policy] = ok
    return [inter, inter_ttft, inter_tpot, batch, absorbs, *drain_rows(name, runs), *tenant_rows(name, runs)]


def tenant_rows(name: str, runs: dict[str, dict]) -> list[Row]:
    """Context: each tenant's TTFT p99, SLA attainment (of offered) and output tok/s."""
    tenants = sorted({t for run in runs.values() for t in run["tenants"]})
    rows = []
    for t in tenants:
        share = next((r["tenants"][t].get("within_share") for r in runs.values() if t in r["tenants"]), None)
        tag = {True: "within share", False: "over share"}.get(share, "")
        lat = Row(name, f"{t} ({tag}) TTFT p99", "", "s")
        att = Row(name, f"{t} SLA attainment", "", "%")
        tps = Row(name, f"{t} output tok/s", "", "tps")
        for policy, run in runs.items():
            g = run["tenants"].get(t)
            lat.values[policy] = None if g is None else g["ttft_s"]["p99"]
            att.values[policy] = None if g is None else g["attainment_all"]
            tps.values[policy] = None if g is None else g["output_throughput_tps"]
        rows += [lat, att, tps]
    return rows


def target_rows(results: dict) -> list[Row]:
    """All rows of the run's results: ``results["runs"][policy][scenario]`` and ``results["solo"]``."""
    solo = results.get("solo", {}).get("quiet_ttft_p99_s")
    by_scenario: dict[str, dict[str, dict]] = {}
    for policy, per in results.get("runs", {}).items():
        for name, run in per.items():
            if "summary" in run:
                by_scenario.setdefault(name, {})[policy] = run["summary"] | {
                    "quiet_ttft_p99_s": run.get("quiet_ttft_p99_s"),
                    "quiet_split": run.get("quiet_split"),
                }
    rows: list[Row] = []
    for name, per_policy in by_scenario.items():
        if name.startswith("noisy-neighbour"):
            rows += noisy_rows(name, per_policy, solo)
        else:
            rows += mixed_rows(name, per_policy)
    return rows
