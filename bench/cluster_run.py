"""The GPU cluster benchmark (issue 8) in one command; ``bench/cluster_run.sh`` wraps it.

    python3 -m bench.cluster_run --out DIR [--smoke] [--config APP.yaml] [--budget-s S]
        [--replicas 1,2] [--engine-estimate-tps X]

1. The engine alone (a child process, before the cluster takes the device): a closed loop of C
   requests of one fixed shape, straight into ``Engine.generate`` (``bench.engine_alone``).
   With ``--engine-estimate-tps`` it is not run: X (an earlier run's figure) stands for it.
2. For each replica count (``--replicas``, default 1): ``fairlane serve`` with the app config at
   that ``num_replicas`` (a child process); wait until ``/health`` counts that many replicas; then
   a. (first count only) the same closed loop through HTTP, the router and the replica: the
      Serve-path overhead;
   b. the capacity sweep (``loadtest.capacity``): ``steady`` on a geometric ladder whose first rung
      is a share of the engine's capacity × the count (a later count: a share of the earlier
      capacity scaled by the counts); ``scaling_factor`` = the last count's capacity / the first's;
   c. (last count only) ``noisy-neighbour`` and ``mixed-sla`` at 1.5 × that capacity (output tok/s);
   d. stop the cluster (and wait for the GPUs to be free) before the next count.
3. DIR gets results.json (everything), table.txt (the table printed last), logs.txt (serve and
   Serve log tails of each cluster) and runs.tar.gz (each run's folder for ``fairlane report``).

Every phase checks the time budget first; a phase that no longer fits is skipped and says so.
Two GPUs in 330 s (plan GPU_X2, chosen when more than one count is given):
``--replicas 1,2 --engine-estimate-tps 9011.6 --budget-s 330``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import yaml
from rich.console import Console

from bench.cluster_args import parser, pick_plan
from bench.cluster_plan import (
    Plan,
    at_load,
    closed_loop,
    effective_config,
    with_answer_scale,
)
from bench.cluster_steps import (
    bundle,
    engine_alone,
    jsonable,
    machine,
    output_share,
    redis_server,
    serve_vs_engine,
    wait_gpus_free,
    warm_up,
    with_replicas,
)
from bench.cluster_table import bench_table
from cluster.config import load_app_config
from loadtest.capacity import offered_output_tps, run_sweep
from loadtest.run_dir import write_run
from loadtest.runner import run_scenario
from loadtest.scenario import Scenario, load_scenario
from loadtest.serve_process import ServeProcess, free_port
from tenancy import DEMO_ADMIN_KEY

ESTIMATE_SOURCE = "--engine-estimate-tps: an earlier engine-alone run's figure, not measured in this run"
CAPACITY_SOURCE = "--capacity-tps: an earlier run's sweep, not measured in this run"


class Bench:
    """One run of the plan; ``results`` is saved after every phase (a killed run still leaves it)."""

    def __init__(self, plan: Plan, out: Path, workdir: Path) -> None:
        self.plan, self.out, self.work = plan, out, workdir
        self.runs = workdir / "runs"
        self.redis_url: str | None = None  # several routers' shared quota state (--redis-server)
        self.t0 = time.monotonic()
        self.logs: list[str] = []
        self.results: dict = {"plan": jsonable(asdict(plan)), "machine": machine()}

    def left(self) -> float:
        return self.plan.budget_s - (time.monotonic() - self.t0)

    def log(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)

    def save(self) -> None:
        self.results["elapsed_s"] = time.monotonic() - self.t0
        text = json.dumps(self.results, indent=1, default=str)
        (self.out / "results.json").write_text(text, encoding="utf-8")

    def run(self) -> None:
        p = self.plan
        cfg = effective_config(p.config, self.work)
        model = load_app_config(cfg).served_model_name
        self.results["title"] = f"{p.config.name}, model {model}, replicas {','.join(map(str, p.replicas))}"
        self.results["app_config"] = yaml.safe_load(cfg.read_text())
        self.results["capacity_by_replicas"] = {}
        loop = closed_loop(p, model)
        engine = self.engine(cfg, loop)
        for i, n in enumerate(p.replicas):
            if self.left() < p.ready_estimate_s + p.rung_s() + p.stop_estimate_s:
                note = f"skipped: {self.left():.0f}s of the budget left"
                self.results["capacity_by_replicas"][str(n)] = {"skipped": note}
                self.log(f"{n} replica(s): {note}")
                continue
            try:
                self.cluster(i, n, cfg, model, loop, engine)
            except Exception:  # a later count may still run (its cluster starts afresh)
                self.results["error"] = traceback.format_exc()
                self.results.setdefault("cluster_errors", {})[str(n)] = self.results["error"]
                print(self.results["error"], file=sys.stderr, flush=True)
        self.results["scaling_factor"] = scaling_factor(self.results["capacity_by_replicas"])
        self.save()

    def engine(self, cfg: Path, loop: Scenario) -> dict:
        """The engine-alone overall summary, or only the given estimate when there is one."""
        p = self.plan
        if p.engine_estimate_tps is not None:
            self.log(f"engine alone: not run, {p.engine_estimate_tps:,.1f} out tok/s from an earlier run")
            engine = {"output_throughput_tps": p.engine_estimate_tps, "source": ESTIMATE_SOURCE}
        else:
            self.log(
                f"engine alone: {3 * p.per_tenant} in flight, {p.prompt_words} in / {p.output_tokens} out"
            )
            engine = engine_alone(cfg, loop, self.runs, timeout_s=max(60.0, self.left() / 2))["overall"]
        self.results["engine_alone"] = engine
        self.save()
        return engine

    def cluster(self, index: int, n: int, base_cfg: Path, model: str, loop: Scenario, engine: dict) -> None:
        """One cluster of ``n`` replicas: start, overhead (first count), sweep, scenarios (last), stop."""
        p = self.plan
        home = self.work / f"r{n}"  # short: Ray's socket paths live under it
        home.mkdir(parents=True, exist_ok=True)
        routers = p.routers_per_replica * n if p.routers_per_replica else None
        serve = ServeProcess(with_replicas(base_cfg, n, routers, self.redis_url), free_port(), home)
        serve.start()
        try:
            ready = serve.wait_ready(min(p.ready_timeout_s, self.left()), min_replicas=n)
            self.results.setdefault("serve_ready_s", {})[str(n)] = ready
            who = f"{n} replica(s), {routers or 'config'} router(s)"
            self.log(f"cluster of {who} ready at {serve.url} after {ready:.0f}s")
            self.results.setdefault("routers_by_replicas", {})[str(n)] = routers
            warm_up(serve.url, model, n)
            if index == 0:
                self.served(serve.url, loop, engine)
            self.sweep(index, n, serve.url, model, engine["output_throughput_tps"])
            if index == len(p.replicas) - 1:
                self.scenarios(serve.url, model, self.results["capacity"]["capacity_output_tps"])
        finally:
            self.log(f"stopping the cluster of {n} replica(s)")
            self.results.setdefault("serve_exit_code", {})[str(n)] = serve.stop()
            self.logs.append(f"######## {n} replica(s)\n{serve.log_tails()}")
            (self.out / "logs.txt").write_text("\n".join(self.logs), encoding="utf-8")
            if index < len(p.replicas) - 1:
                self.results.setdefault("gpus_free_wait_s", {})[str(n)] = wait_gpus_free(30.0)
            self.save()

    def served(self, url: str, loop: Scenario, engine: dict) -> None:
        self.log("Serve path: the same closed loop over HTTP")
        result = run_scenario(loop, url, show_progress=False)
        served = write_run(self.runs / "serve-path", loop, url, result)
        comparison = serve_vs_engine(engine, served, 3 * self.plan.per_tenant)
        comparison["engine_output_share"] = output_share(self.runs / "engine-alone")
        comparison["serve_output_share"] = output_share(self.runs / "serve-path")
        self.results["serve_vs_engine"] = comparison
        self.save()

    def first_rung_tps(self, n: int, estimate: float) -> tuple[float, str]:
        """Output tok/s of the first rung for ``n`` replicas, and what it was derived from."""
        p = self.plan
        measured = [(int(k), c) for k, c in self.results["capacity_by_replicas"].items() if "steps" in c]
        if measured:
            k, c = measured[-1]
            tps = p.rescale_start * n / k * c["capacity_output_tps"]
            return tps, f"{p.rescale_start:g} × {n}/{k} × the {k}-replica capacity"
        if p.start_tps:
            return p.start_tps * n, f"--start-tps {p.start_tps:g} × {n}"
        return p.start_fraction * n * estimate, f"{p.start_fraction:g} × {n} × the engine estimate"

    def sweep(self, index: int, n: int, url: str, model: str, estimate: float) -> None:
        p = self.plan
        if p.capacity_tps is not None:  # an earlier run's sweep: only the scenarios run here
            cap = {"replicas": n, "capacity_output_tps": p.capacity_tps, "source": CAPACITY_SOURCE}
            self.log(f"{n} replica(s): no sweep; capacity {p.capacity_tps:,.1f} out tok/s, an earlier run's")
            self.results["capacity_by_replicas"][str(n)] = cap
            self.results["capacity"] = cap
            return
        steady_tps = offered_output_tps(load_scenario(p.sweep.scenario))
        first_tps, basis = self.first_rung_tps(n, estimate)
        # The plan's start_scale is a floor: a first rung too slow to send a handful of requests is wasted.
        start = max(p.sweep.start_scale, first_tps / steady_tps)
        rule = p.sweep.model_copy(update={"start_scale": start, "model": model})
        reserve = p.reserve_after_sweep(index)

        def on_step(s) -> None:
            self.log(
                f"  rung ×{s.scale:.3g}: offered {s.offered_rps:.2f} req/s, achieved {s.achieved_rps:.2f} "
                f"req/s / {s.achieved_tps:.1f} tok/s, TTFT p99 {s.ttft_p99_s or 0:.2f}s, "
                f"client CPU {s.client_cpu:.2f}"
                f"{'; saturated: ' + s.saturated if s.saturated else ''}"
            )

        self.log(
            f"{n} replica(s): capacity sweep from scale {start:.3g} ({basis}; ×{rule.factor:g} per rung)"
        )
        fits = lambda: self.left() > reserve + p.rung_s()  # noqa: E731
        cap = run_sweep(url, rule, self.runs / f"sweep-{n}r", should_continue=fits, on_step=on_step)
        cap |= {"replicas": n, "first_rung_basis": basis}
        self.results["capacity_by_replicas"][str(n)] = cap
        self.results["capacity"] = cap  # the scenarios' capacity: the latest count's
        self.save()

    def scenarios(self, url: str, model: str, cap: float) -> None:
        p = self.plan
        self.results["scenarios"] = {}
        for name in p.scenarios:
            run: dict = {"load_factor": p.load_factor}
            self.results["scenarios"][name] = run
            if cap <= 0:
                run["skipped"] = "skipped: no capacity measured"
                continue
            if self.left() < p.scenario_s + p.scenario_drain_s + p.stop_estimate_s:
                run["skipped"] = f"skipped: {self.left():.0f}s of the budget left"
                self.log(f"{name}: {run['skipped']}")
                continue
            time.sleep(2.0)  # the last rung's cancelled requests are aborted on the replica meanwhile
            base = with_answer_scale(load_scenario(name), p.answer_scale)
            scale = p.load_factor * cap / offered_output_tps(base)
            sc = at_load(name, scale, p, model)
            run["scale"] = scale
            self.log(f"{name} at ×{p.load_factor:g} capacity: scale {scale:.3g}")
            result = run_scenario(sc, url, admin_key=DEMO_ADMIN_KEY, show_progress=False)
            run["summary"] = write_run(self.runs / name, sc, url, result)
            run["output_share"] = output_share(self.runs / name)
            self.save()


def scaling_factor(by_replicas: dict) -> dict | None:
    """The last measured count's capacity over the first's, per replica added; None below two counts."""
    measured = sorted((int(k), c) for k, c in by_replicas.items() if "steps" in c)
    if len(measured) < 2 or measured[0][1]["capacity_output_tps"] <= 0:
        return None
    (n0, c0), (n1, c1) = measured[0], measured[-1]
    return {
        "from_replicas": n0,
        "to_replicas": n1,
        "factor": c1["capacity_output_tps"] / c0["capacity_output_tps"],
        "ideal": n1 / n0,
        "both_saturated": bool(c0["saturated"] and c1["saturated"]),
    }


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    plan = pick_plan(args)
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="fl-bench-"))  # short: Ray's socket paths live under it
    bench = Bench(plan, args.out, workdir)
    code = 0
    try:
        with redis_server(args.redis_server, workdir) as bench.redis_url:
            bench.run()
        code = 1 if bench.results.get("error") else 0
    except Exception:
        bench.results["error"] = traceback.format_exc()
        print(bench.results["error"], file=sys.stderr, flush=True)
        code = 1
    finally:
        bench.results.setdefault(
            "scaling_factor", scaling_factor(bench.results.get("capacity_by_replicas", {}))
        )
        bench.save()
        bundle(workdir, args.out)
        console = Console(width=150, record=True)
        console.print(bench_table(bench.results))
        (args.out / "table.txt").write_text(console.export_text(), encoding="utf-8")
        shutil.rmtree(workdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
