"""The three dispatch policies on one GPU, on the same seeded traces, side by side (issue 23).

    python3 -m bench.policy_run --out DIR [--smoke] [--capacity-tps X] [--budget-s S]
        [--policies fairlane,vtc,fcfs] [--scenarios noisy-neighbour-pairs,mixed-sla] [--duration-s D]

One Ray and Serve in this process (``cluster.ops.local_cluster``, as ``fairlane demo`` does), the
app of ``--config`` (default ``gpu-8b.yaml``: Llama-3.1-8B shape, random weights, one replica)
deployed with ``dispatch_policy=fairlane`` first; for each later policy the app is redeployed under
its name with that policy (``cluster.ops.local_cluster.redeploy``; Ray and Serve stay up). Under each policy
every scenario runs at 1.5 × ``--capacity-tps`` (an earlier sweep's one-replica capacity, no sweep
here) with the same seed, so every policy gets the same requests; under ``fairlane`` the noisy
scenario's quiet tenants also run alone (the solo run, target (a)). ``bench/policy_targets.py``
says what each target is.

Each run is its load, then its drain: every request it admitted, to its end (``loadtest/drain.py``).
The phases are planned to fit the time budget first (``bench/policy_schedule.py``: what does not fit
is left out, least needed first, and said); each run's drain is capped at what the phases after it
leave over, and each phase checks the time left before it starts. Whatever is skipped is in
results.json's ``skipped`` (phase and why) and in the table. DIR gets
results.json (every figure, the command, commit, machine, date), table.txt (the table printed
last), runs.tar.gz (each run's folder for ``fairlane report``), logs.txt (Serve's log tails).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from rich.console import Console

from bench.cluster_args import app_setting
from bench.cluster_steps import bundle, jsonable, machine, warm_up
from bench.policy_plan import GPU, NOISY_TENANTS, SMOKE, PolicyPlan, check_names, quiet_tenants
from bench.policy_schedule import Phase, Schedule, build_schedule, drain_cap_s, scenario_for
from bench.policy_steps import client_url, commit, wait_idle
from bench.policy_table import policy_table
from bench.policy_targets import compact, quiet_split, quiet_ttft_p99
from cluster.config import AppConfig, load_app_config
from loadtest.run_dir import SUMMARY_FILE, read_server, write_json, write_run
from loadtest.runner import run_scenario
from loadtest.scenario import Scenario
from loadtest.serve_process import REPO_ROOT, ServeProcess, free_port
from loadtest.summary import summarize
from tenancy import DEMO_ADMIN_KEY

Redeploy = Callable[[AppConfig], str]  # cluster.ops.local_cluster.redeploy: the app again, its URL


class PolicyBench:
    """One run of the plan; ``results`` is saved after every run (a killed run still leaves it)."""

    def __init__(self, plan: PolicyPlan, out: Path, workdir: Path, argv: list[str]) -> None:
        self.plan, self.out, self.work = plan, out, workdir
        self.runs = workdir / "runs"
        self.port = 0  # the app's, chosen when the cluster starts; every redeploy keeps it
        self.t0 = time.monotonic()
        self.results: dict = {
            "command": " ".join(["python3 -m bench.policy_run", *argv]),
            "commit": commit(),
            "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "plan": jsonable(asdict(plan)),
            "policies_run": [],
            "runs": {},
            "skipped": [],  # {"phase", "why"}: left out by the plan's budget or, later, by the time left
            "notes": [],
        }

    def left(self) -> float:
        return self.plan.budget_s - (time.monotonic() - self.t0)

    def log(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)

    def note(self, msg: str) -> None:
        self.log(msg)
        self.results["notes"].append(msg)

    def save(self, console: Console | None = None) -> None:
        """results.json and table.txt as they stand (a run killed later still leaves both)."""
        self.results["elapsed_s"] = time.monotonic() - self.t0
        text = json.dumps(self.results, indent=1, default=str)
        (self.out / "results.json").write_text(text, encoding="utf-8")
        console = console or Console(width=160, record=True, file=io.StringIO())
        console.print(policy_table(self.results))
        (self.out / "table.txt").write_text(console.export_text(), encoding="utf-8")

    def app_config(self, policy: str, port: int) -> AppConfig:
        overrides = {**dict(self.plan.settings), "dispatch_policy": policy, "port": port}
        cfg = load_app_config(self.plan.config, overrides)
        tenancy = cfg.tenancy_config
        if tenancy and not Path(tenancy).is_absolute():  # Serve actors do not run in this folder
            cfg = cfg.model_copy(update={"tenancy_config": str((REPO_ROOT / tenancy).resolve())})
        return cfg

    def run(self) -> None:
        # Ray: only when a cluster is started
        from cluster.ops.local_cluster import local_cluster, redeploy, short_router_drain_window

        p = self.plan
        self.port = free_port()
        first = self.app_config(p.ordered_policies()[0], self.port)
        model = first.served_model_name
        schedule = build_schedule(p, model)
        self.results["title"] = (
            f"{p.config.name} ({model}), 1 replica, {p.load_factor:g}× {p.capacity_tps:,.0f} out tok/s, "
            f"{p.duration_s:g} s of load per run, drained to the end"
        )
        self.results["app_config"] = first.model_dump(mode="json")
        self.results["schedule"] = schedule.as_list()
        self.results["schedule_estimate_s"] = schedule.total_s()
        for label, why in schedule.skipped:
            self.skip(label, why)
        os.environ["RAY_TMPDIR"] = str(self.work / "ray")  # this run's Ray only, never another's
        # The run's only load balancer is its own edge, and nothing is sent while a redeploy waits
        # for the old routers to stop: Serve's 30-s window was most of each redeploy (the demo's).
        short_router_drain_window()
        t = time.monotonic()
        with local_cluster(first) as url:
            url = client_url(first, url)
            self.results["serve_ready_s"] = time.monotonic() - t
            warm_up(url, model, 1)
            deployed = p.ordered_policies()[0]
            self.log(f"cluster up at {url} after {self.results['serve_ready_s']:.0f}s ({deployed})")
            for phase in schedule.phases:
                if phase.kind == "redeploy":
                    url, deployed = self.redeploy(phase, schedule, url, deployed, redeploy)
                elif phase.kind in ("run", "solo"):
                    self.run_phase(phase, schedule, url, model, deployed)
            self.log("stopping the cluster")

    def redeploy(
        self, phase: Phase, schedule: Schedule, url: str, deployed: str, redeploy_app: Redeploy
    ) -> tuple[str, str]:
        """The app again under ``phase.policy``, if it and its first run still fit the budget."""
        p = self.plan
        nxt = next((q for q in schedule.phases if q.kind == "run" and q.policy == phase.policy), None)
        need = p.redeploy_estimate_s + (nxt.estimate_s if nxt else 0.0) + p.stop_estimate_s
        if self.left() < need:
            self.skip(phase.label, f"{self.left():.0f}s of the budget left, {need:.0f}s needed")
            return url, deployed
        t = time.monotonic()
        cfg = self.app_config(phase.policy, self.port)
        url = client_url(cfg, redeploy_app(cfg))
        warm_up(url, cfg.served_model_name, 1)
        self.results.setdefault("redeploy_s", {})[phase.policy] = time.monotonic() - t
        self.log(f"redeployed with dispatch_policy={phase.policy} in {time.monotonic() - t:.0f}s")
        return url, phase.policy

    def run_phase(self, phase: Phase, schedule: Schedule, url: str, model: str, deployed: str) -> None:
        p = self.plan
        if phase.policy != deployed:
            self.skip(phase.label, f"{phase.policy} was not deployed (its redeploy was skipped)")
            return
        if phase.policy not in self.results["policies_run"]:
            self.results["policies_run"].append(phase.policy)
        sc = scenario_for(phase, p, model)
        if self.left() < phase.estimate_s + p.stop_estimate_s:
            self.skip(phase.label, f"{self.left():.0f}s of the budget left, {phase.estimate_s:.0f}s needed")
            run: dict = {"skipped": f"{self.left():.0f}s of the budget left"}
        else:
            cap = drain_cap_s(p, schedule, phase, sc, self.left())
            run = self.one(phase.label, sc.model_copy(update={"drain_timeout_s": cap}), url)
        if phase.kind == "solo":  # target (a)'s baseline
            self.results["solo"] = run | {"scenario": phase.scenario}
        else:
            self.results["runs"].setdefault(phase.policy, {})[phase.scenario] = run

    def skip(self, label: str, why: str) -> None:
        """A phase left out: results.json's ``skipped`` and the table's "skipped" rows say so."""
        self.results["skipped"].append({"phase": label, "why": why})
        self.log(f"{label}: skipped, {why}")

    def one(self, label: str, sc: Scenario, url: str) -> dict:
        """One scenario run: its compact summary and the quiet tenants' pooled TTFT p99."""
        p = self.plan
        idle = wait_idle(url, p.settle_s)  # the last run's requests leave the router first
        if idle["in_flight"] or idle["queued"]:
            self.note(f"{label}: started with {idle['in_flight']} in flight, {idle['queued']} queued")
        rate = sum(t.rate or 0.0 for t in sc.tenants)
        self.log(
            f"{label}: {len(sc.tenants)} tenants, {rate:.2f} req/s, {sc.duration_s:.0f}s of load, "
            f"drain expected {p.drain_estimate_s(sc):.0f}s, capped at {sc.drain_timeout_s:.0f}s"
        )
        try:
            result = run_scenario(sc, url, admin_key=DEMO_ADMIN_KEY, show_progress=False)
            summary = summarize_at_capacity(self.runs / label, sc, url, result, p)
        except Exception:  # a later run may still work; the run's error is kept
            err = traceback.format_exc()
            print(err, file=sys.stderr, flush=True)
            self.results.setdefault("errors", {})[label] = err
            return {"error": err.splitlines()[-1]}
        run: dict = {"summary": compact(summary), "idle_before": idle}
        o, drain = summary["overall"], summary["meta"].get("drain") or {}
        line = (
            f"{label}: {o['ok']}/{o['requests']} ok, {o['cut']} cut, "
            f"{o['output_throughput_tps']:.1f} out tok/s, drained in {drain.get('waited_s', 0):.1f}s"
        )
        if o["cut"]:
            self.note(f"{label}: {o['cut']} requests cut by the drain's cap (in no attainment)")
        if sc.name in NOISY_TENANTS:
            run["quiet_tenants"] = quiet = quiet_tenants(sc.name, [t.id for t in sc.tenants])
            run["quiet_ttft_p99_s"] = quiet_ttft_p99(result.records, quiet)
            run["quiet_split"] = quiet_split(result.records, read_server(self.runs / label, "timings"), quiet)
            line += f", quiet TTFT p99 {run['quiet_ttft_p99_s'] or 0:.3f}s"
        self.log(line)
        self.save()
        return run


def summarize_at_capacity(out: Path, sc: Scenario, url: str, result, plan: PolicyPlan) -> dict:
    """The run's folder (``write_run``), its summary redone with the known capacity in ``meta``, so
    within/over share is decided by the capacity the load was sized on (``loadtest/share_split.py``)."""
    first = write_run(out, sc, url, result, plan.window_s)
    meta = first["meta"] | {"capacity_output_tps": plan.capacity_tps, "load_factor": plan.load_factor}
    summary = summarize(
        result.records, sc.classes, meta, result.replica_seconds, sc.gpu_dollars_per_hour, plan.window_s
    )
    write_json(out / SUMMARY_FILE, summary)
    return summary


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="fcfs, vtc and fairlane on the same seeded traces (issue 23).")
    ap.add_argument("--out", type=Path, required=True, help="Folder for results.json and table.txt.")
    ap.add_argument("--smoke", action="store_true", help="SmolLM2 random weights on the CPU, tiny durations.")
    ap.add_argument("--config", type=Path, help="App config (default: gpu-8b.yaml, or cpu-smoke.yaml).")
    ap.add_argument("--capacity-tps", type=float, help="The cluster's output tok/s (GPU default 13839).")
    ap.add_argument("--budget-s", type=float, help="Time budget of the whole run in seconds.")
    ap.add_argument("--policies", help="Comma-separated, of fcfs,vtc,fairlane (fairlane runs first).")
    ap.add_argument("--scenarios", help="Comma-separated scenarios at 1.5x capacity.")
    ap.add_argument("--duration-s", type=float, help="Seconds of load per run.")
    ap.add_argument("--drain-s", type=float, help="A cap on each run's drain (default: the budget's only).")
    ap.add_argument("--answer-scale", type=float, help="Answer lengths x this (GPU default 20).")
    ap.add_argument("--window-s", type=float, help="Fairness window in seconds (GPU default 5).")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE: an AppConfig override.")
    ap.add_argument("--client-procs", type=int, help="Load generator processes (GPU default 4).")
    return ap


def pick_plan(args: argparse.Namespace) -> PolicyPlan:
    plan = SMOKE if args.smoke else GPU
    split = lambda s: tuple(x.strip() for x in s.split(",") if x.strip())  # noqa: E731
    given = {
        "config": args.config,
        "capacity_tps": args.capacity_tps,
        "budget_s": args.budget_s,
        "policies": None if args.policies is None else split(args.policies),
        "scenarios": None if args.scenarios is None else split(args.scenarios),
        "duration_s": args.duration_s,
        "drain_cap_s": args.drain_s,
        "answer_scale": args.answer_scale,
        "window_s": args.window_s,
        "settings": tuple(app_setting(s) for s in args.set) or None,
        "client_procs": args.client_procs,
    }
    plan = replace(plan, **{k: v for k, v in given.items() if v is not None})
    check_names(plan.policies, plan.scenarios)
    return plan


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    plan = pick_plan(args)
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="fl-pol-"))  # short: Ray's socket paths live under it
    bench = PolicyBench(plan, args.out, workdir, argv)
    code = 0
    try:
        bench.run()
        code = 1 if bench.results.get("errors") else 0
    except Exception:
        bench.results["error"] = traceback.format_exc()
        print(bench.results["error"], file=sys.stderr, flush=True)
        code = 1
    finally:
        bundle(workdir, args.out)
        tails = ServeProcess(plan.config, 0, workdir).log_tails()  # Serve's logs under RAY_TMPDIR
        (args.out / "logs.txt").write_text(tails, encoding="utf-8")
        bench.save(Console(width=160, record=True))  # printed last
        shutil.rmtree(workdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
