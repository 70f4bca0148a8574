"""How long an engine takes to start, and where the time goes: weights, then each group of CUDA graphs.

    python -m bench.replica_start --model llama-3.1-8b --random-weights --json out/start.json

Each variant starts an engine in a child process of its own (a fresh CUDA context, nothing compiled in
memory) with its own Triton cache folder: `cold` starts from an empty one, as a new machine's replica
does; `warm` reuses the folder the variant before it filled, as a restarted replica on the same
machine does. Variants: context graphs on (cold, then warm) and off (cold). Per variant: the seconds
to a running engine, the model load, and per graph group (decode graphs per step kind, fresh-chunk
mixed graphs, context graphs per key rung, the split steps' graphs) the graphs captured and the
seconds spent in warm-up runs and in capture. Runs with torch, transformers and numpy alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import tempfile
import time
from pathlib import Path

VARIANTS = (("context-cold", True, "a"), ("context-warm", True, "a"), ("no-context-cold", False, "b"))


def graph_groups(runner) -> list[dict]:
    """Every captured graph set of a runner with its counts and timings (DecodeGraphs.timing)."""
    groups = {f"decode/{kind}": g for kind, g in runner.graphs.items()}
    groups |= {f"mixed-fresh/{kind}": g for kind, g in runner.mixed.fresh.items()}
    groups |= {f"mixed-context/{kind}/{keys}": g for (kind, keys), g in runner.mixed.context.items()}
    split = runner.split
    if split.forward_graphs is not None:
        groups["split/forward"] = split.forward_graphs
    if split.mixed_forward_graphs is not None:
        groups["split/mixed-forward"] = split.mixed_forward_graphs
    groups |= {f"split/draw/{kind}": g for kind, g in split.draw_graphs.items()}
    return [{"group": name, "graphs": len(g.graphs), **g.timing} for name, g in groups.items()]


def record_compiles() -> list[dict]:
    """Every Triton compile in this process from now on: the kernel, its constants, milliseconds and
    whether the cache folder held it (Triton's compilation listener)."""
    compiles: list[dict] = []
    try:
        from triton import knobs
    except ImportError:  # an older Triton: no listener
        return compiles

    def listener(src, metadata, metadata_group, times, cache_hit) -> None:
        name = getattr(getattr(src, "fn", None), "__name__", str(src)[:40])
        constants = {str(k): str(v) for k, v in (getattr(src, "constants", None) or {}).items()}
        total_ms = (times.ir_initialization + times.total_lowering + times.store_results) / 1000
        compiles.append({"kernel": name, "constants": constants, "ms": total_ms, "cache_hit": cache_hit})

    knobs.compilation.listener = listener
    return compiles


def start_once(args: argparse.Namespace, context: bool, queue) -> None:
    """Child process: start one engine, report its timings on `queue`, stop it."""
    from replica import model_loader
    from replica.config import EngineConfig
    from replica.engine import Engine

    loads: list[float] = []
    real_load = model_loader.load_model

    def timed_load(*a, **k):
        t = time.perf_counter()
        got = real_load(*a, **k)
        loads.append(time.perf_counter() - t)
        return got

    import replica.engine as engine_module

    engine_module.load_model = timed_load  # the engine module's own name for it
    compiles = record_compiles()
    config = EngineConfig(
        model=args.model, device=args.device, random_weights=args.random_weights,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens,
        max_model_len=args.max_model_len, enable_prefix_caching=True, context_cuda_graphs=context,
    )  # fmt: skip

    async def run() -> dict:
        engine = Engine(config)
        t = time.perf_counter()
        await engine.start()
        started = time.perf_counter() - t
        runner = engine.core.runner
        report = {
            "start_s": started, "load_s": loads[0] if loads else None, "groups": graph_groups(runner),
            "num_blocks": engine.core.scheduler.blocks.num_blocks, "triton_compiles": compiles,
            "context_rungs": list(runner.mixed.context_rungs),
        }  # fmt: skip
        await engine.stop()
        return report

    queue.put(asyncio.run(run()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--max-batched-tokens", type=int, default=2048)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--variants", default=",".join(v[0] for v in VARIANTS))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    caches = {tag: tempfile.mkdtemp(prefix=f"triton-{tag}-") for _, _, tag in VARIANTS}
    result = {"machine": platform.node(), "args": vars(args) | {"json": str(args.json)}, "variants": {}}
    ctx = mp.get_context("spawn")
    for name, context, tag in VARIANTS:
        if name not in args.variants.split(","):
            continue
        os.environ["TRITON_CACHE_DIR"] = caches[tag]  # the child inherits it
        queue = ctx.Queue()
        child = ctx.Process(target=start_once, args=(args, context, queue))
        t = time.perf_counter()
        child.start()
        got = queue.get()
        child.join()
        got["process_s"] = time.perf_counter() - t
        result["variants"][name] = got
        print_variant(name, got)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))


def print_variant(name: str, got: dict) -> None:
    graphs = sum(g["graphs"] for g in got["groups"])
    print(f"{name}: start {got['start_s']:.1f}s (process {got['process_s']:.1f}s), "
          f"load {got['load_s']:.1f}s, "
          f"{graphs} graphs, {got['num_blocks']} blocks, context rungs {got['context_rungs']}",
          flush=True)  # fmt: skip
    for g in got["groups"]:
        slowest = max(g.get("warmup_by_size", {}).items(), key=lambda kv: kv[1], default=(None, 0.0))
        print(f"  {g['group']:<28} {g['graphs']:>4} graphs  warm-up {g['warmup_s']:7.2f}s  "
              f"capture {g['capture_s']:7.2f}s  slowest warm-up: size {slowest[0]}, {slowest[1]:.2f}s",
              flush=True)  # fmt: skip
    compiles = got["triton_compiles"]
    by_kernel: dict[str, list[float]] = {}
    for c in compiles:
        by_kernel.setdefault(c["kernel"], []).append(c["ms"])
    total = sum(c["ms"] for c in compiles) / 1000
    print(f"  triton: {len(compiles)} compiles, {total:.1f}s in the compiler", flush=True)
    for name, ms in sorted(by_kernel.items(), key=lambda kv: -sum(kv[1]))[:12]:
        print(f"    {name:<32} {len(ms):>4} compiles {sum(ms) / 1000:7.1f}s", flush=True)


if __name__ == "__main__":
    main()
