"""A CPU engine's start, before and after a change, in fresh processes taking turns.

    python -m bench.cpu_engine_start --out F --tree before=/tmp/before --tree after=. [--runs 5]

Each run is a child process (imports, then `Engine.start()` of SmolLM2-135M on the CPU with a
`--kv-tokens` pool, the engine's default 32,768 unless set; its checkpoint or, with
`--random-weights`, the preset's random weights) with PYTHONPATH set to its tree: the
seconds from `start()` to a running engine, and the process's peak and final resident memory. The
trees take turns run by run, so a load on the box falls on both alike. The cluster's CPU replicas and
the suite's engines start the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import asyncio, json, resource, time
from replica import Engine, EngineConfig

async def main():
    config = EngineConfig(
        model="smollm2-135m", device="cpu", random_weights=RANDOM, kv_cache_tokens=KV_TOKENS
    )
    engine = Engine(config)
    began = time.perf_counter()
    await engine.start()
    took = time.perf_counter() - began
    with open("/proc/self/statm") as f:
        resident = int(f.read().split()[1]) * 4096
    await engine.stop()
    return took, resident

took, resident = asyncio.run(main())
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
import replica
print(json.dumps({"start_s": took, "resident_mb": resident / 2**20, "peak_mb": peak / 2**20,
                  "code": replica.__file__}))
"""


def one_run(tree: Path, kv_tokens: int, random_weights: bool) -> dict:
    env = os.environ | {"PYTHONPATH": str(tree.resolve())}
    child = CHILD.replace("KV_TOKENS", str(kv_tokens)).replace("RANDOM", str(random_weights))
    # cwd: `python -c` puts the working directory first on sys.path, ahead of PYTHONPATH
    run = dict(env=env, cwd=tree.resolve(), capture_output=True, text=True, check=True)
    out = subprocess.run([sys.executable, "-c", child], **run)
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(runs: list[dict]) -> dict:
    keys = [k for k, v in runs[0].items() if isinstance(v, float)]
    return {k: {"median": statistics.median(r[k] for r in runs), "min": min(r[k] for r in runs),
                "max": max(r[k] for r in runs)} for k in keys}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=DIR (repeatable)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--kv-tokens", type=int, default=32768, help="the CPU pool (the engine's default)")
    parser.add_argument("--random-weights", action="store_true", help="the preset's random weights")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.runs):
        for name, tree in trees.items():
            runs[name].append(one_run(Path(tree), args.kv_tokens, args.random_weights))
    result = {
        "model": "smollm2-135m", "device": "cpu", "kv_cache_tokens": args.kv_tokens,
        "random_weights": args.random_weights, "trees": trees, "runs": runs,
        "summary": {name: summary(r) for name, r in runs.items()},
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for name, s in result["summary"].items():
        start, peak, resident = s["start_s"], s["peak_mb"]["median"], s["resident_mb"]["median"]
        print(
            f"{name:8s} start {start['median']:.2f} s (min {start['min']:.2f}, max {start['max']:.2f})",
            end="",
        )
        print(f"  peak {peak:.0f} MB  resident {resident:.0f} MB")


if __name__ == "__main__":
    main()
