"""A new user's defaults against the hand-sized config, on the same seeded traces (issue 49).

    bash bench/gpu_defaults.sh "$OUT"            # one H200: the 8B shape from a checkpoint directory
    bash bench/gpu_defaults.sh OUTDIR --smoke    # the CPU: SmolLM2's shape, small rates (~4 min)

1. A random-weight checkpoint directory of the shape (``bench.write_checkpoint``), written once: the
   path a new user serves (``fairlane serve --model DIR``).
2. For each variant, one after the other on the same machine:
   * ``sized``: ``loadtest/configs/gpu-8b.yaml`` (128 slots, room 128, 2,048 tokens per step, a
     4,096 context, the served name set) serving that directory;
   * ``defaults``: an app config naming only the model and the tenancy file, as a new user writes
     it; everything else is chosen by the cluster;
   * ``slots-256`` (``--variants``; only when the budget allows): the defaults with 256 slots, what
     vLLM's larger defaults would give.

   For each: ``fairlane serve --config`` (a child), ``/health`` until its engine reports; the line the
   CLI printed and ``/health``'s engine figures; then
   a. **solo**: the quiet tenant alone (2 req/s, 64-token answers, Poisson, sampled): ITL at the
      client against the TPOT the router saw (the engine's pace: the router's own TPOT does not move
      with how its pieces are grouped);
   b. **flood**: the quiet tenant beside a noisy one (70 req/s of 256-token answers, over the
      replica's capacity), the load split over client processes: the noisy tenant's delivered
      tok/s (the capacity), the quiet tenant's TTFT p50/p99 and ITL at the client.
3. ``results.json`` and ``table.txt`` in ``--out``; each variant's serve log tail in ``logs.txt``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from bench.gpu_defaults_load import Trace, measure, trace_for
from loadtest.serve_process import ServeProcess, free_port

REPO = Path(__file__).resolve().parents[1]
SIZED = REPO / "loadtest/configs/gpu-8b.yaml"
TENANCY = REPO / "loadtest/configs/gpu-tenants.yaml"
READY_TIMEOUT_S = 420.0


def variant_config(name: str, checkpoint: Path, smoke: bool) -> dict:
    """The app config of one variant, serving ``checkpoint``."""
    device = {"device": "cpu"} if smoke else {}
    if name == "sized":
        sized = yaml.safe_load(SIZED.read_text())
        engine = {**sized["engine"], "model": str(checkpoint), "random_weights": False}
        engine |= {"synthetic_tokenizer": False, **device}
        if smoke:  # the CPU's own small sizes, set as the sized config sets them
            engine |= {"max_num_seqs": 8, "max_num_batched_tokens": 512}
        config = {**sized, "engine": engine, "tenancy_config": str(TENANCY)}
        return config | ({"replica_room": 8, "replica_num_gpus": 0} if smoke else {})
    config = {"engine": {"model": str(checkpoint), **device}, "tenancy_config": str(TENANCY)}
    if name == "slots-256":
        config["engine"]["max_num_seqs"] = 256
    return config


def write_checkpoint(shape: str, out: Path, smoke: bool) -> dict:
    """The checkpoint directory, written by a child (its GPU memory is gone before serving starts)."""
    if (out / "config.json").exists():
        return {"out": str(out), "reused": True}
    cmd = [sys.executable, "-m", "bench.write_checkpoint", "--shape", shape, "--out", str(out)]
    cmd += ["--device", "cpu", "--dtype", "float32"] if smoke else ["--dtype", "bfloat16"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def wait_engine(url: str, timeout_s: float) -> dict:
    """``/health`` until a replica reported its engine; its figures."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = httpx.get(f"{url}/health", timeout=5).json()
        engines = [e for e in body.get("engines", {}).values() if e]
        if engines:
            return engines[0]
        time.sleep(1.0)
    raise TimeoutError("no engine reported in /health")


def run_variant(name: str, config: dict, work: Path, trace: Trace) -> dict:
    """One variant's cluster: start, measure solo then flood, stop."""
    work.mkdir(parents=True, exist_ok=True)
    cfg_path = work / "app.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    serve = ServeProcess(cfg_path, free_port(), work)
    out: dict = {"config": config}
    t0 = time.monotonic()
    serve.start()
    try:
        serve.wait_ready(READY_TIMEOUT_S)
        out["engine"] = wait_engine(serve.url, 60.0)
        out["ready_s"] = time.monotonic() - t0
        model = httpx.get(f"{serve.url}/v1/models", headers=trace.auth, timeout=10).json()["data"][0]["id"]
        out["served_name"] = model
        out |= measure(serve.url, model, trace)
    finally:  # the CLI's sizes line comes after readiness: read it once the loads are done
        lines = serve.log_path.read_text().splitlines()
        out["printed"] = [line for line in lines if " per replica (" in line]
        out["logs"] = serve.log_tails(lines=40)
        serve.stop()
    return out


def table(results: dict) -> str:
    head = (
        "variant", "served name", "slots / room", "step tokens", "KV tokens", "noisy tok/s",
        "quiet TTFT p50 / p99 (flood)", "quiet ITL p50 / p99 (flood)", "solo ITL p50", "solo router TPOT p50",
    )  # fmt: skip
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, v in results["variants"].items():
        if "error" in v or "flood" not in v:
            rows.append(f"| {name} | {v.get('error', v.get('skipped', '?'))} |")
            continue
        e, f, s = v["engine"], v["flood"], v["solo"]
        rows.append(
            f"| {name} | {v['served_name']} | {e['max_num_seqs']} / {e['room']} | "
            f"{e['max_num_batched_tokens']} | {e['kv_tokens']:,} | {f['noisy_tps']:,.0f} | "
            f"{_ms(f['quiet_ttft']['p50'])} / {_ms(f['quiet_ttft']['p99'])} | "
            f"{_ms(f['quiet_itl']['p50'])} / {_ms(f['quiet_itl']['p99'])} | "
            f"{_ms(s['quiet_itl']['p50'])} | {_ms(s['router_tpot']['p50'])} |"
        )
    return "\n".join(rows)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="SmolLM2's shape on the CPU, small rates")
    ap.add_argument("--variants", default="sized,defaults", help="sized, defaults, slots-256")
    ap.add_argument("--budget-s", type=float, default=560.0, help="skip a variant that no longer fits")
    ap.add_argument("--checkpoint", type=Path, default=Path("/tmp/fairlane-bench/Llama-3.1-8B-shaped"))
    args = ap.parse_args()
    t0 = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    shape = "smollm2-135m" if args.smoke else "llama-3.1-8b"
    checkpoint = args.checkpoint.with_name("SmolLM2-135M-shaped") if args.smoke else args.checkpoint
    results: dict = {"checkpoint": write_checkpoint(shape, checkpoint, args.smoke), "variants": {}}
    trace = trace_for(args.smoke)
    results["trace"] = trace.describe()
    for name in args.variants.split(","):
        left = args.budget_s - (time.monotonic() - t0)
        if left < trace.variant_estimate_s:
            results["variants"][name] = {"skipped": f"{left:.0f} s of the budget left"}
            continue
        work = Path(tempfile.mkdtemp(prefix=f"fd-{name}-"))  # short: Ray's socket paths must fit 107 bytes
        try:
            results["variants"][name] = run_variant(
                name, variant_config(name, checkpoint, args.smoke), work, trace
            )
        except Exception as exc:  # the next variant starts a cluster of its own
            results["variants"][name] = {"error": repr(exc)}
        logs = results["variants"][name].pop("logs", "")
        with (args.out / "logs.txt").open("a") as f:
            f.write(f"===== {name}\n{logs}\n")
        (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    results["elapsed_s"] = time.monotonic() - t0
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    text = table(results)
    (args.out / "table.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
