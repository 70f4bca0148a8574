"""The cluster benchmark's command line (``bench.cluster_run``): options → a ``Plan``."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.cluster_plan import GPU, GPU_X2, SMOKE, SMOKE_X2, Plan


def app_setting(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of an ``AppConfig`` field (``engine.late_launch``: a nested one); the value is read
    as JSON when it parses."""
    key, sep, value = text.partition("=")
    if not sep:
        raise SystemExit(f"--set takes KEY=VALUE, not {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def pick_plan(args: argparse.Namespace) -> Plan:
    replicas = tuple(int(x) for x in args.replicas.split(",") if x.strip())
    rung = {
        "step_duration_s": args.rung_s,
        "step_drain_s": args.rung_drain_s,
        "factor": args.factor,
        "warmup_fraction": args.rung_warmup_fraction,
        "throughput": args.rung_throughput,
    }
    rung = {k: v for k, v in rung.items() if v is not None}
    names = None if args.scenarios is None else tuple(filter(None, args.scenarios.split(",")))
    if not replicas or min(replicas) < 1:
        raise SystemExit(f"--replicas {args.replicas!r}: counts ≥ 1, e.g. 1,2")
    plans = (SMOKE_X2, GPU_X2) if len(replicas) > 1 else (SMOKE, GPU)
    plan = plans[0] if args.smoke else plans[1]
    return replace(
        plan,
        config=args.config or plan.config,
        budget_s=args.budget_s or plan.budget_s,
        replicas=replicas,
        engine_estimate_tps=args.engine_estimate_tps,
        sweep=plan.sweep.model_copy(update={"scenario": args.sweep_scenario, **rung}),
        start_tps=args.start_tps,
        scenarios=plan.scenarios if names is None else names,
        routers_per_replica=args.routers_per_replica,
        answer_scale=args.answer_scale,
        capacity_tps=args.capacity_tps,
        rescale_start=args.rescale_start or plan.rescale_start,
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="The GPU cluster benchmark (issue 8) in one command.")
    ap.add_argument("--out", type=Path, required=True, help="Folder for the few files that come back.")
    ap.add_argument("--smoke", action="store_true", help="SmolLM2 random weights on the CPU, tiny rates.")
    ap.add_argument("--config", type=Path, help="App config (default: gpu-8b.yaml, or cpu-smoke.yaml).")
    ap.add_argument("--budget-s", type=float, help="Time budget of the whole run in seconds.")
    ap.add_argument("--replicas", default="1", help="Replica counts, one cluster each, e.g. 1,2 (two GPUs).")
    ap.add_argument(
        "--engine-estimate-tps",
        type=float,
        help="Skip the engine-alone run; its output tok/s from an earlier run.",
    )
    ap.add_argument(
        "--sweep-scenario", default="steady", help="The sweep's scenario (steady-long: ~512-token answers)."
    )
    ap.add_argument("--start-tps", type=float, help="First rung, output tok/s per replica.")
    ap.add_argument("--rung-s", type=float, help="Seconds of load per sweep rung (default: the plan's).")
    ap.add_argument("--rung-drain-s", type=float, help="Seconds a rung's requests get to end.")
    ap.add_argument("--factor", type=float, help="Rate multiplier from one rung to the next (plan: 1.5).")
    ap.add_argument(
        "--rescale-start", type=float, help="A later count's first rung: R × count ratio × capacity (0.5)."
    )
    ap.add_argument("--rung-warmup-fraction", type=float, help="Share of a rung left unmeasured (0.1).")
    ap.add_argument(
        "--rung-throughput",
        choices=("span", "window"),
        help="A rung's output tok/s: over first send to last end (span), or while its load is on (window).",
    )
    ap.add_argument(
        "--capacity-tps", type=float, help="Skip the sweep; the scenarios' capacity from an earlier run's."
    )
    ap.add_argument("--scenarios", help="Scenarios at 1.5x capacity, comma-separated ('' for none).")
    ap.add_argument(
        "--answer-scale", type=float, default=1.0, help="The scenarios' answer lengths x this (GPU: ~16)."
    )
    ap.add_argument(
        "--routers-per-replica", type=int, default=0, help="num_routers = this × replicas (0: the config's)."
    )
    ap.add_argument(
        "--redis-server", type=Path, help="A redis-server binary: the routers share quota state through it."
    )
    return ap
