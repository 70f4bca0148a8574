"""Adapter churn (issue 44): 500 registered LoRA adapters cycling through a 32-slot pool. Does a load
add at most 50 ms to TTFT at p99, and do the other requests' steps go on while loads run?

    python -m bench.lora_churn --out out/lora_churn.json          # 8B shape, random weights, ~4 min
    python -m bench.lora_churn --smoke --out /tmp/lora_churn.json  # CPU, SmolLM2, ~30 s

One LoRA engine (--slots slots, max rank --rank). One random rank-16 adapter on all seven modules
(bench/lora_step.py's `write_adapter`, of the engine's shapes) is registered under --registered names
a0, a1, ...: to the engine distinct names are distinct adapters (each its own host image, slot and
load), and only one file is written. The same Poisson trace (engine_trace's `make_trace` at --rate,
the realistic sampling mix as bench/lora_trace.py sends it) runs twice; only the names differ:
- "resident": request i names a{i % slots}; a warm-up made those resident, so no request loads;
- "churn": request i names the i-th of a seeded permutation of all the names (cycled), so nearly
  every request needs a load into the least recently released idle slot (the few that do not find
  their adapter left in a slot by the resident run or a recent request).
Each request is tagged as it is sent: "resident" where its adapter is in a slot then (or loading
already), else "load". The churn run's TTFT by tag separates what a load costs its own request from
waiting behind one (admission is in order: a request whose adapter is loading holds up the queue).

Headline: `ttft_p99_added_ms`, churn TTFT p99 - resident TTFT p99 (target <= 50 ms; `targets`), and
the stall check (`stall`): churn ITL p99 and TPOT p50 over resident's, and both runs' largest ITL.
Ratios near 1 and no new ITL spike say the other requests' steps went on while the loads ran.

The rate. A load is to be measured, not slot contention: with every slot held (as many distinct
adapters running as slots) a request for another adapter waits for a running one to end, which is
queueing. In the churn run nearly every running request has its own adapter, so held slots are the
concurrency, rate x request time (Little's law). The 8B shape with LoRA decodes about 12-15 ms a
token on an H100 (about 10 on an H200) and the trace's answers average ~236 tokens (median 200,
lognormal): ~3 s a request. At 10 req/s ~30 would run on average, the pool full at every peak; at
the default 6 req/s ~18 (Poisson: all 32 held well under 1% of the time). Each run records what
happened, sampled every 5 ms: `max_slots_held` (distinct adapters running at once),
`slots_full_fraction` and `max_running` (sequences). The default 300 requests name 300 of the 500
adapters in the churn run; the rest cost what registration costs, time and host memory.

Host memory (`adapter_load`, with the process's peak RSS): each registered name has its own pinned
host image of one slot, 80 MiB for the 8B shape at rank 16, which PyTorch's pinned allocator rounds
up to a power of two (128 MiB): ~62.5 GiB for 500 names, on a 128 GiB host. The registry kept each
adapter's float32 matrices too (160 MiB more each: ~140 GiB in all, which does not fit); it now
drops them once packed (replica/lora_registry.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import resource
import tempfile
from pathlib import Path

import numpy as np

from bench.engine_trace import (
    Tag,
    TraceRequest,
    engine_config,
    loaded_model,
    make_trace,
    report_header,
    run_and_report,
    run_trace,
)
from bench.lora_step import adapter_names, register_adapters, slot_load_ms, write_adapter
from bench.lora_trace import lora_bench_parser, measure, parse_with, trace_mix, warm_trace
from replica.engine import Engine

TARGET_TTFT_ADDED_MS = 50.0  # issue 44: the p99 TTFT a load adds
WATCH_EVERY_S = 0.005
SMOKE = dict(
    model="smollm2-135m", device="cpu", requests=16, rate=20.0, slots=4, registered=16, max_num_seqs=8,
    prompt_median=24, prompt_max=48, output_median=8, output_sigma=0.3, output_max=12, register_workers=2,
)  # fmt: skip


def churn_names(registered: int, seed: int) -> list[str]:
    """Every registered name once, in a seeded order: request i names the i-th (cycled), so an
    adapter comes back only after all the others, long evicted by then."""
    names = adapter_names(registered)
    return [names[i] for i in np.random.default_rng(seed).permutation(registered)]


def resident_tag(engine: Engine) -> Tag:
    """Tags a request "resident" where its adapter is in a slot (or loading) as it is sent, else
    "load": whether it should need a load of its own."""
    return lambda name: "resident" if name in engine.resident_adapters() else "load"


async def watch_slots(engine: Engine, seen: dict) -> None:
    """Until cancelled: the most slots held at once (distinct adapters running), the most running
    sequences, and how many samples found every slot held (new adapters then wait for a slot)."""
    scheduler = engine.core.scheduler
    slots = scheduler.lora
    while True:
        held = sum(1 for users in slots.users if users > 0)
        seen["samples"] += 1
        seen["full_samples"] += held == slots.num_slots
        seen["max_slots_held"] = max(seen["max_slots_held"], held)
        seen["max_running"] = max(seen["max_running"], len(scheduler.running))
        await asyncio.sleep(WATCH_EVERY_S)


async def watched_run(engine: Engine, trace: list[TraceRequest], mix: str, names: list[str]) -> dict:
    """One run (lora_trace's `measure`: the summary, slot loads, preemptions), each request tagged
    by `resident_tag`, the slot pool watched meanwhile."""
    seen = dict.fromkeys(("samples", "full_samples", "max_slots_held", "max_running"), 0)
    watcher = asyncio.create_task(watch_slots(engine, seen))
    try:
        result = await measure(engine, trace, mix, list(names), resident_tag(engine))
    finally:
        watcher.cancel()
    full = seen.pop("full_samples") / max(1, seen.pop("samples"))
    return result | seen | {"slots_full_fraction": full}


def headline(results: dict[str, dict]) -> dict:
    """The TTFT p99 the loads added and the stall check, once both runs are in."""
    res, churn = results.get("resident"), results.get("churn")
    if res is None or churn is None:
        return {}
    added = churn["ttft_ms_p99"] - res["ttft_ms_p99"]
    return {
        "ttft_p99_added_ms": added,
        "ttft_p50_added_ms": churn["ttft_ms_p50"] - res["ttft_ms_p50"],
        "stall": {
            "itl_p99_ratio": churn["itl_ms_p99"] / res["itl_ms_p99"],
            "tpot_p50_ratio": churn["tpot_ms_p50"] / res["tpot_ms_p50"],
            "itl_ms_max": {"resident": res["itl_ms_max"], "churn": churn["itl_ms_max"]},
        },
        "targets": {"ttft_p99_added_ms_max": TARGET_TTFT_ADDED_MS,
                    "ttft_p99_added_ok": added <= TARGET_TTFT_ADDED_MS},
    }  # fmt: skip


def peak_rss_gib() -> float:
    """The process's peak resident memory (Linux counts ru_maxrss in KiB); pinned images count."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def register(engine: Engine, args) -> dict:
    """Write the adapter and register it under --registered names; what that took."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write_adapter(Path(tmp) / "adapter", args.rank, args.seed, engine.lora.shapes)
        loads = register_adapters(engine, path, args.registered, args.register_workers)
    image = engine.lora.layout.slot_bytes(engine.dtype)
    return loads | {
        "registered": len(engine.adapters()),
        "slot_bytes": image,
        "host_images_gib": image * args.registered / 2**30,  # before any rounding by the allocator
        "peak_rss_gib": peak_rss_gib(),
    }


def save(args, out: dict) -> None:
    """The report so far to --out: after registering and after each run (one cut off by its time
    limit still reports what came before)."""
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))


async def runs(engine: Engine, args, out: dict) -> None:
    """Warm up a0 ... a{slots-1} into the slots, then the resident and the churn run on the same
    trace, the report saved after each."""
    vocab = engine.loaded.config.vocab_size
    mix = out["mix"] = trace_mix(engine)
    resident = adapter_names(args.slots)
    await run_trace(
        engine, warm_trace(make_trace(args, vocab, math.inf), args.slots, args.output_max), mix, resident
    )
    trace = make_trace(args, vocab, args.rate)
    for key, names in (("resident", resident), ("churn", churn_names(args.registered, args.seed))):
        r = out["results"][key] = await watched_run(engine, trace, mix, names)
        print(f"[churn] {key}: TTFT p99 {r['ttft_ms_p99']:.1f} ms, {r['slot_loads']} loads", flush=True)
        save(args, out | headline(out["results"]))


async def run(args) -> dict:
    out: dict = {**report_header(args, {}), "results": {}}
    engine = Engine(engine_config(args, lora_slots=args.slots, max_lora_rank=args.rank))
    await engine.start()
    try:
        out["model"] = loaded_model(engine)
        out["adapter_load"] = register(engine, args)
        save(args, out)
        print(
            f"[churn] registered {args.registered} in {out['adapter_load']['register_all_s']:.1f} s",
            flush=True,
        )
        await runs(engine, args, out)
        # After the runs (it rewrites slot 0; every name has a0's weights): the bare copy a load is.
        out["adapter_load"]["slot_load_ms"] = slot_load_ms(engine)
        out["adapter_load"]["peak_rss_gib"] = peak_rss_gib()
    finally:
        await engine.stop()
    return out | headline(out["results"])


def print_table(rep: dict) -> None:
    cols = ("output_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "itl_ms_p50", "itl_ms_p99",
            "itl_ms_max", "slot_loads", "preemptions", "max_slots_held", "max_running")  # fmt: skip
    names = ["tok/s", "ttft_p50", "ttft_p99", "tpot_p50", "itl_p50", "itl_p99", "itl_max", "loads",
             "preempt", "held", "running"]  # fmt: skip
    print(f"\n{'run':<10}" + "".join(f"{n:>10}" for n in names))
    for key, r in rep["results"].items():
        print(
            f"{key:<10}"
            + "".join(f"{r[c]:>10.2f}" if isinstance(r[c], float) else f"{r[c]:>10}" for c in cols)
        )
        tags = ", ".join(
            f"{tag} {t['requests']} p50 {t['ttft_ms_p50']:.1f} p99 {t['ttft_ms_p99']:.1f}"
            for tag, t in r["ttft_by_tag"].items()
        )
        print(f"{'':<10}TTFT by adapter at send: {tags}; all slots held {r['slots_full_fraction']:.1%}")
    load = rep["adapter_load"]
    print(
        f"registered {load['registered']} in {load['register_all_s']:.1f} s ({load['workers']} threads), "
        f"host images {load['host_images_gib']:.1f} GiB, peak RSS {load['peak_rss_gib']:.1f} GiB, "
        f"slot load {load['slot_load_ms']:.2f} ms"
    )
    if "stall" in rep:
        stall, ok = rep["stall"], rep["targets"]["ttft_p99_added_ok"]
        print(
            f"TTFT p99 added {rep['ttft_p99_added_ms']:.1f} ms (target <= {TARGET_TTFT_ADDED_MS:.0f}: "
            f"{ok}); churn / resident ITL p99 {stall['itl_p99_ratio']:.3f}x, "
            f"TPOT p50 {stall['tpot_p50_ratio']:.3f}x, max ITL {stall['itl_ms_max']['churn']:.1f} vs "
            f"{stall['itl_ms_max']['resident']:.1f} ms"
        )


def parser() -> argparse.ArgumentParser:
    p = lora_bench_parser(__doc__, "CPU, SmolLM2, 4 slots, 16 names, short requests")
    p.add_argument("--requests", type=int, default=300, help="requests per run")
    p.add_argument("--rate", type=float, default=6.0, help="requests per second (Poisson)")
    p.add_argument("--slots", type=int, default=32, help="the device's adapter slots")
    p.add_argument("--registered", type=int, default=500, help="adapter names registered")
    return p


def parse(argv: list[str] | None) -> argparse.Namespace:
    return parse_with(argv, parser, SMOKE)


def main(argv: list[str] | None = None) -> dict:
    return run_and_report(parse(argv), run, print_table)


if __name__ == "__main__":
    main()
