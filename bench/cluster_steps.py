"""Steps of the cluster benchmark (``bench.cluster_run``) that need no state of the run."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import httpx
import yaml

from loadtest.run_dir import read_run_records, read_summary
from loadtest.scenario import Scenario
from loadtest.serve_process import REPO_ROOT, free_port
from tenancy import DEMO_KEYS


def engine_alone(cfg: Path, sc: Scenario, runs: Path, timeout_s: float) -> dict:
    """The engine-alone run in a child process: its memory and CUDA context are gone when it exits."""
    spec = runs.parent / "closed-loop.json"
    spec.write_text(sc.model_dump_json(), encoding="utf-8")
    out = runs / "engine-alone"
    cmd = [sys.executable, "-m", "bench.engine_alone", "--config", str(cfg), "--scenario", str(spec)]
    subprocess.run([*cmd, "--out", str(out)], cwd=REPO_ROOT, check=True, timeout=timeout_s)
    return read_summary(out)


def output_share(run: Path) -> float | None:
    """Output tokens / max_tokens over successful requests: below 1, some stopped early (EOS)."""
    if not run.exists():
        return None
    ok = [r for r in read_run_records(run) if r.ok]
    asked = sum(r.max_tokens for r in ok)
    return sum(r.output_tokens for r in ok) / asked if asked else None


def serve_vs_engine(engine: dict, served: dict, concurrency: int) -> dict:
    """Serve path vs engine alone; ``engine`` may hold only ``output_throughput_tps`` (an earlier run's)."""
    e, s = engine, served["overall"]
    e_tps = e.get("output_throughput_tps")
    e_ttft, e_tpot = e.get("ttft_s") or {}, e.get("tpot_s") or {}
    return {
        "concurrency": concurrency,
        "engine_source": e.get("source", "measured in this run"),
        "engine_output_tps": e_tps,
        "serve_output_tps": s["output_throughput_tps"],
        "throughput_ratio": s["output_throughput_tps"] / e_tps if e_tps else None,
        "engine_ttft_p50_s": e_ttft.get("p50"),
        "serve_ttft_p50_s": s["ttft_s"]["p50"],
        "engine_tpot_p50_s": e_tpot.get("p50"),
        "serve_tpot_p50_s": s["tpot_s"]["p50"],
        "engine_ok": e.get("ok"),
        "serve_ok": s["ok"],
    }


def warm_up(url: str, model: str, replicas: int) -> None:
    """A few requests per replica, several at once, so the first rung pays for no replica's first use."""
    body = {"model": model, "prompt": "the time of day", "max_tokens": 4, "temperature": 0.0}
    headers = {"Authorization": f"Bearer {DEMO_KEYS['alice']}"}

    def one(_: int) -> None:
        httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120).raise_for_status()

    with ThreadPoolExecutor(max_workers=2 * replicas) as pool:
        list(pool.map(one, range(4 * replicas)))


def with_replicas(cfg: Path, replicas: int, routers: int | None = None, redis_url: str | None = None) -> Path:
    """A copy of the app config with ``num_replicas`` set (each keeps its ``replica_num_gpus``), and
    ``num_routers`` / ``redis_url`` where given (several routers share quota state through Redis)."""
    data = yaml.safe_load(cfg.read_text(encoding="utf-8")) | {"num_replicas": replicas}
    if routers is not None:
        data["num_routers"] = routers
    if redis_url is not None:
        data["redis_url"] = redis_url
    out = cfg.with_name(f"app-{replicas}r.yaml")
    out.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return out


@contextlib.contextmanager
def redis_server(binary: Path | None, workdir: Path) -> Iterator[str | None]:
    """A throwaway Redis server for the run (no persistence); None without a binary."""
    if binary is None:
        yield None
        return
    port = free_port()
    argv = [str(binary.resolve()), "--port", str(port), "--bind", "127.0.0.1"]
    argv += ["--save", "", "--appendonly", "no"]  # nothing written to disk
    proc = subprocess.Popen(argv, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:  # listening once a TCP connect succeeds
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def wait_gpus_free(timeout_s: float) -> float:
    """Seconds until no process holds a GPU (the stopped cluster's workers may take a moment to exit)."""
    t0 = time.monotonic()
    if not shutil.which("nvidia-smi"):
        return 0.0
    q = ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"]
    while time.monotonic() - t0 < timeout_s:
        if not subprocess.run(q, capture_output=True, text=True, check=False).stdout.strip():
            break
        time.sleep(1.0)
    return time.monotonic() - t0


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
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)


def jsonable(data: dict) -> dict:
    return json.loads(json.dumps(data, default=str))


def bundle(workdir: Path, out: Path, limit_bytes: int = 15 << 20) -> None:
    """runs.tar.gz of every run folder; the sweep rungs' records go first when it would be too big."""
    target = out / "runs.tar.gz"
    if not (workdir / "runs").is_dir():  # every phase was skipped
        return
    for excludes in ((), ("--exclude=runs/sweep*/*/records.jsonl",), ("--exclude=*/records.jsonl",)):
        subprocess.run(["tar", "czf", str(target), *excludes, "runs"], cwd=workdir, check=False)
        if target.exists() and target.stat().st_size <= limit_bytes:
            return
    target.unlink(missing_ok=True)
