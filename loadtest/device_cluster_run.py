"""The GPU cluster benchmark (issue 8) in one command; ``loadtest/device_cluster_run.sh`` wraps it.

    python3 -m loadtest.device_cluster_run --out DIR [--smoke] [--config APP.yaml] [--budget-s S]

1. The engine alone (a child process, before the cluster takes the device): a closed loop of C
   requests of one fixed shape, straight into ``Engine.generate`` (``loadtest.engine_alone``).
2. ``fairlane serve`` with the app config (a child process); wait for ``/health``.
3. The same closed loop through HTTP, the router and the replica: the Serve-path overhead.
4. The capacity sweep (``loadtest.capacity``): ``steady`` on a geometric ladder whose first rung
   is a share of the capacity the engine-alone run suggests.
5. ``noisy-neighbour`` and ``mixed-sla`` at 1.5 × that capacity (output tokens per second).
6. Stop the cluster. DIR gets results.json (everything), table.txt (the table printed last),
   logs.txt (serve and Serve log tails) and runs.tar.gz (each run's folder for ``fairlane report``).

Every phase checks the time budget first; a phase that no longer fits is skipped and says so.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path

import httpx
import yaml
from rich.console import Console

from loadtest.capacity import offered_output_tps, run_sweep
from loadtest.cluster_bench_plan import GPU, SMOKE, Plan, at_load, closed_loop, effective_config
from loadtest.cluster_bench_table import bench_table
from loadtest.run_dir import read_run_records, read_summary, write_run
from loadtest.runner import run_scenario
from loadtest.scenario import Scenario, load_scenario
from loadtest.serve_process import REPO_ROOT, ServeProcess, free_port
from tenancy import DEMO_ADMIN_KEY, DEMO_KEYS


def engine_alone(cfg: Path, sc: Scenario, runs: Path, timeout_s: float) -> dict:
    """The engine-alone run in a child process: its memory and CUDA context are gone when it exits."""
    spec = runs.parent / "closed-loop.json"
    spec.write_text(sc.model_dump_json(), encoding="utf-8")
    out = runs / "engine-alone"
    cmd = [sys.executable, "-m", "loadtest.engine_alone", "--config", str(cfg), "--scenario", str(spec)]
    subprocess.run([*cmd, "--out", str(out)], cwd=REPO_ROOT, check=True, timeout=timeout_s)
    return read_summary(out)


def output_share(run: Path) -> float | None:
    """Output tokens / max_tokens over successful requests: below 1, some stopped early (EOS)."""
    ok = [r for r in read_run_records(run) if r.ok]
    asked = sum(r.max_tokens for r in ok)
    return sum(r.output_tokens for r in ok) / asked if asked else None


def serve_vs_engine(engine: dict, served: dict, concurrency: int) -> dict:
    e, s = engine["overall"], served["overall"]
    ratio = s["output_throughput_tps"] / e["output_throughput_tps"] if e["output_throughput_tps"] else None
    return {
        "concurrency": concurrency,
        "engine_output_tps": e["output_throughput_tps"],
        "serve_output_tps": s["output_throughput_tps"],
        "throughput_ratio": ratio,
        "engine_ttft_p50_s": e["ttft_s"]["p50"],
        "serve_ttft_p50_s": s["ttft_s"]["p50"],
        "engine_tpot_p50_s": e["tpot_s"]["p50"],
        "serve_tpot_p50_s": s["tpot_s"]["p50"],
        "engine_ok": e["ok"],
        "serve_ok": s["ok"],
    }


def warm_up(url: str, model: str) -> None:
    """A few requests so the first rung does not pay for the path's first use."""
    body = {"model": model, "prompt": "the time of day", "max_tokens": 4, "temperature": 0.0}
    headers = {"Authorization": f"Bearer {DEMO_KEYS['alice']}"}
    for _ in range(3):
        httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120).raise_for_status()


class Bench:
    """One run of the plan; ``results`` is saved after every phase (a killed run still leaves it)."""

    def __init__(self, plan: Plan, out: Path, workdir: Path) -> None:
        self.plan, self.out, self.work = plan, out, workdir
        self.runs = workdir / "runs"
        self.t0 = time.monotonic()
        self.results: dict = {"plan": _jsonable(asdict(plan)), "machine": machine()}

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
        model = yaml.safe_load(cfg.read_text())["served_model_name"]
        self.results["title"] = f"{p.config.name}, model {model}"
        self.results["app_config"] = yaml.safe_load(cfg.read_text())
        loop = closed_loop(p, model)
        self.log(f"engine alone: {3 * p.per_tenant} in flight, {p.prompt_words} in / {p.output_tokens} out")
        engine = engine_alone(cfg, loop, self.runs, timeout_s=max(60.0, self.left() / 2))
        self.results["engine_alone"] = engine["overall"]
        self.save()
        serve = ServeProcess(cfg, free_port(), self.work)
        serve.start()
        try:
            self.results["serve_ready_s"] = serve.wait_ready(min(p.ready_timeout_s, self.left()))
            self.log(f"cluster ready at {serve.url} after {self.results['serve_ready_s']:.0f}s")
            warm_up(serve.url, model)
            self.served(serve.url, loop, engine)
            self.sweep(serve.url, model, engine)
            self.scenarios(serve.url, model)
        finally:
            self.log("stopping the cluster")
            self.results["serve_exit_code"] = serve.stop()
            (self.out / "logs.txt").write_text(serve.log_tails(), encoding="utf-8")
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

    def sweep(self, url: str, model: str, engine: dict) -> None:
        p = self.plan
        estimate = engine["overall"]["output_throughput_tps"]
        steady_tps = offered_output_tps(load_scenario(p.sweep.scenario))
        # The plan's start_scale is a floor: a first rung too slow to send a handful of requests is wasted.
        start = max(p.sweep.start_scale, p.start_fraction * estimate / steady_tps)
        rule = p.sweep.model_copy(update={"start_scale": start, "model": model})
        reserve = len(p.scenarios) * (p.scenario_s + p.scenario_drain_s + 10) + 30
        step_s = rule.step_duration_s + rule.step_drain_s + 5

        def on_step(s) -> None:
            self.log(
                f"  rung ×{s.scale:.3g}: offered {s.offered_rps:.2f} req/s, achieved {s.achieved_rps:.2f} "
                f"req/s / {s.achieved_tps:.1f} tok/s, TTFT p99 {s.ttft_p99_s or 0:.2f}s, "
                f"client CPU {s.client_cpu:.2f}"
                f"{'; saturated: ' + s.saturated if s.saturated else ''}"
            )

        self.log(f"capacity sweep from scale {start:.3g} (×{rule.factor:g} per rung)")
        fits = lambda: self.left() > reserve + step_s  # noqa: E731
        sweep_dir = self.runs / "sweep"
        self.results["capacity"] = run_sweep(url, rule, sweep_dir, should_continue=fits, on_step=on_step)
        self.save()

    def scenarios(self, url: str, model: str) -> None:
        p = self.plan
        cap = self.results["capacity"]["capacity_output_tps"]
        self.results["scenarios"] = {}
        for name in p.scenarios:
            run: dict = {"load_factor": p.load_factor}
            self.results["scenarios"][name] = run
            if cap <= 0:
                run["skipped"] = "skipped: no capacity measured"
                continue
            if self.left() < p.scenario_s + p.scenario_drain_s + 20:
                run["skipped"] = f"skipped: {self.left():.0f}s of the budget left"
                continue
            time.sleep(2.0)  # the last rung's cancelled requests are aborted on the replica meanwhile
            scale = p.load_factor * cap / offered_output_tps(load_scenario(name))
            sc = at_load(name, scale, p, model)
            run["scale"] = scale
            self.log(f"{name} at ×{p.load_factor:g} capacity: scale {scale:.3g}")
            result = run_scenario(sc, url, admin_key=DEMO_ADMIN_KEY, show_progress=False)
            run["summary"] = write_run(self.runs / name, sc, url, result)
            run["output_share"] = output_share(self.runs / name)
            self.save()


def machine() -> dict:
    info = {"python": platform.python_version(), "cpus": _cpus()}
    for pkg in ("torch", "transformers", "ray"):
        try:
            info[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            info[pkg] = None
    if shutil.which("nvidia-smi"):
        q = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        info["gpus"] = subprocess.run(q, capture_output=True, text=True, check=False).stdout.strip()
    return info


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)


def _jsonable(data: dict) -> dict:
    return json.loads(json.dumps(data, default=str))


def bundle(workdir: Path, out: Path, limit_bytes: int = 15 << 20) -> None:
    """runs.tar.gz of every run folder; the sweep rungs' records go first when it would be too big."""
    target = out / "runs.tar.gz"
    for excludes in ((), ("--exclude=runs/sweep/*/records.jsonl",), ("--exclude=*/records.jsonl",)):
        subprocess.run(["tar", "czf", str(target), *excludes, "runs"], cwd=workdir, check=False)
        if target.exists() and target.stat().st_size <= limit_bytes:
            return
    target.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="Folder for the few files that come back.")
    ap.add_argument("--smoke", action="store_true", help="SmolLM2 random weights on the CPU, tiny rates.")
    ap.add_argument("--config", type=Path, help="App config (default: gpu-8b.yaml, or cpu-smoke.yaml).")
    ap.add_argument("--budget-s", type=float, help="Time budget of the whole run in seconds.")
    args = ap.parse_args(argv)
    plan = SMOKE if args.smoke else GPU
    plan = replace(plan, config=args.config or plan.config, budget_s=args.budget_s or plan.budget_s)
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="fl-bench-"))  # short: Ray's socket paths live under it
    bench = Bench(plan, args.out, workdir)
    code = 0
    try:
        bench.run()
    except Exception:
        bench.results["error"] = traceback.format_exc()
        print(bench.results["error"], file=sys.stderr, flush=True)
        code = 1
    finally:
        bench.save()
        bundle(workdir, args.out)
        console = Console(width=150, record=True)
        console.print(bench_table(bench.results))
        (args.out / "table.txt").write_text(console.export_text(), encoding="utf-8")
        shutil.rmtree(workdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
