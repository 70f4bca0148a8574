"""Multi-LoRA under realistic traffic (issue 44): the base model alone against 1, 8 and 64 distinct
adapters, on the same Poisson trace and sampling mix, in one run on one GPU.

    python -m bench.lora_trace --out out/lora_trace.json          # 8B shape, random weights, ~5 min
    python -m bench.lora_trace --smoke --out /tmp/lora_trace.json  # CPU, SmolLM2, ~40 s

The trace is bench/engine_trace.py's (`make_trace`, fixed by --seed: Poisson arrivals at each of
--rates, "inf" all at once; lognormal prompt and output lengths, EOS ignored) sent with the
realistic sampling mix (loadtest/sampling_mix.py); an engine without a tokenizer (the 8B preset
with random weights) cannot constrain output to a JSON schema, so there the mix goes without its
schemas (`mixed_noschema`, as the load generator's `mix_without_schemas`; the JSON's "mix").
Configurations, each at every rate on the same trace:
- "base": an engine with LoRA off (the reference), started, run and stopped first;
- "adapters_N": one LoRA engine (--adapters' largest count of slots, max rank --rank) with request i
  naming adapter a{i % N}. One random rank-16 adapter on q, k, v, o, gate, up and down
  (bench/lora_step.py's `write_adapter`, of the engine's shapes) is registered under every name:
  distinct slots, distinct weight reads, one file to write. Before the measured runs every adapter
  is made resident (a short warm-up request each), so the runs see the serving cost, not the loads.

Per run: output tokens/s, requests/s, TTFT, TPOT and ITL at p50 and p99 (engine_trace's
`summarise`, `vllm bench serve`'s definitions), preemptions and slot loads; per adapter count and
rate, throughput and TPOT p50 ÷ the base's (issue targets at 64 adapters: ≥ 0.85× and ≤ 1.15×).
Adapter load, disk → GPU: one registration (read, checked, packed into a pinned host image; the file
was just written, so it is likely in the page cache) plus one slot's host → device copy
(lora_step's `slot_load_ms`). `adapter_effect`: one prompt greedy with and without a0 on the LoRA
engine; the tokens differ unless the adapter is ignored. JSON to --out after every run; a table last.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from bench.engine_trace import (
    Tag,
    TraceRequest,
    add_engine_args,
    add_trace_shape_args,
    engine_config,
    loaded_model,
    make_trace,
    report_header,
    run_and_report,
    run_trace,
)
from bench.lora_step import adapter_names, register_adapters, slot_load_ms, write_adapter
from replica.engine import Engine
from replica.sampling_params import SamplingParams

TARGETS = {"throughput": 0.85, "tpot_p50": 1.15}  # issue 44, at the largest adapter count
WARM_OUTPUT_TOKENS = 32  # warm-up answers: enough for the decode shapes, short of a run's time
SMOKE = dict(
    model="smollm2-135m", device="cpu", requests=6, rates="50,inf", adapters="1,2", max_num_seqs=8,
    prompt_median=24, prompt_max=48, output_median=8, output_sigma=0.3, output_max=16,
)  # fmt: skip


def warm_trace(trace: list[TraceRequest], count: int, output_max: int) -> list[TraceRequest]:
    """The trace's first 8 requests with short answers (the kernels meet its prompt shapes), then
    short ones up to `count`: one per adapter, so every slot is loaded before the measured runs."""
    answer = min(WARM_OUTPUT_TOKENS, output_max)
    cycled = itertools.islice(itertools.cycle(trace), max(8, count))
    return [
        replace(r, arrival_s=0.0, prompt=r.prompt if i < 8 else r.prompt[:32], output_tokens=answer)
        for i, r in enumerate(cycled)
    ]


async def measure(
    engine: Engine, trace: list[TraceRequest], mix: str, names: list[str | None], tag: Tag | None = None
) -> dict:
    """One run of the trace, with the preemptions and slot loads it caused (`tag`: run_trace's)."""
    slots = engine.core.scheduler.lora
    before = engine.stats().num_preemptions, slots.num_loads if slots else 0
    result = await run_trace(engine, trace, mix, names, tag)
    result["preemptions"] = engine.stats().num_preemptions - before[0]
    if slots is not None:
        result["slot_loads"] = slots.num_loads - before[1]
    return result


def trace_mix(engine: Engine) -> str:
    """The realistic sampling mix, without its JSON schemas where the engine has no tokenizer to
    constrain output with (the 8B preset with random weights)."""
    return "mixed" if engine.loaded.tokenizer is not None else "mixed_noschema"


async def run_configs(engine: Engine, args, configs: dict, out: dict) -> None:
    """Every configuration at every rate on this engine, into out["results"]; the JSON is written
    after each run (a run cut off by its time limit still reports)."""
    vocab = engine.loaded.config.vocab_size
    mix = out["mix"] = trace_mix(engine)
    every_name = list(dict.fromkeys(n for names in configs.values() for n in names))
    await run_trace(
        engine,
        warm_trace(make_trace(args, vocab, math.inf), len(every_name), args.output_max),
        mix,
        every_name,
    )
    for config, names in configs.items():
        for rate_name in args.rates.split(","):
            rate = math.inf if rate_name == "inf" else float(rate_name)
            key = f"{config}@{rate_name}"
            out["results"][key] = await measure(engine, make_trace(args, vocab, rate), mix, names)
            print(f"[lora] {key}: {out['results'][key]['output_tokens_per_s']:.0f} tok/s", flush=True)
            out["vs_base"] = vs_base(out["results"])
            if args.json:
                args.json.write_text(json.dumps(out, indent=2, default=str))


async def adapter_effect(engine: Engine, prompt: list[int], name: str, tokens: int = 16) -> dict:
    """The same prompt greedy without and with adapter `name`, each alone on the engine."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)

    async def greedy(adapter: str | None) -> list[int]:
        return [t async for out in engine.generate(prompt, params, adapter=adapter) for t in out.token_ids]

    without, with_adapter = await greedy(None), await greedy(name)
    return {"base_tokens": without, "adapter_tokens": with_adapter, "differs": without != with_adapter}


async def base_runs(args, out: dict) -> None:
    engine = Engine(engine_config(args))
    await engine.start()
    try:
        out["model"] = loaded_model(engine)
        await run_configs(engine, args, {"base": [None]}, out)
    finally:
        await engine.stop()


async def lora_runs(args, out: dict) -> None:
    counts = [int(n) for n in args.adapters.split(",")]
    engine = Engine(engine_config(args, lora_slots=max(counts), max_lora_rank=args.rank))
    await engine.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = write_adapter(Path(tmp) / "adapter", args.rank, args.seed, engine.lora.shapes)
            loads = register_adapters(engine, path, max(counts), args.register_workers)
        loads["slot_bytes"] = engine.lora.layout.slot_bytes(engine.dtype)
        out["adapter_load"] = loads
        await run_configs(engine, args, {f"adapters_{n}": adapter_names(n) for n in counts}, out)
        loads["slot_load_ms"] = slot_load_ms(engine)  # after the runs: it rewrites slot 0
        loads["disk_to_gpu_ms"] = loads["register_s"] * 1e3 + loads["slot_load_ms"]
        slots = engine.core.scheduler.lora
        loads |= {"slot_loads_total": slots.num_loads, "resident": len(engine.resident_adapters())}
        prompt = make_trace(args, engine.loaded.config.vocab_size, math.inf)[0].prompt
        out["adapter_effect"] = await adapter_effect(engine, prompt, "a0")
    finally:
        await engine.stop()


def vs_base(results: dict[str, dict]) -> dict:
    """Each adapter run's throughput and TPOT p50 over the base's at the same rate."""
    ratios = {}
    for key, r in results.items():
        config, rate = key.split("@")
        base = results.get(f"base@{rate}")
        if config != "base" and base:
            ratios[key] = {
                "throughput": r["output_tokens_per_s"] / base["output_tokens_per_s"],
                "tpot_p50": r["tpot_ms_p50"] / base["tpot_ms_p50"],
            }
    return ratios


def free_device() -> None:
    """Let the stopped engine's weights go before the next engine sizes its KV cache from what is free."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


async def run(args) -> dict:
    out: dict = {**report_header(args, {}), "results": {}}
    await base_runs(args, out)
    free_device()
    await lora_runs(args, out)
    out["targets"] = targets(out["vs_base"], max(int(n) for n in args.adapters.split(",")))
    return out


def targets(ratios: dict, adapters: int) -> dict:
    """Whether the runs with `adapters` distinct adapters meet the issue's targets, per rate."""
    return {
        key: {
            "throughput_ok": r["throughput"] >= TARGETS["throughput"],
            "tpot_ok": r["tpot_p50"] <= TARGETS["tpot_p50"],
        }
        for key, r in ratios.items()
        if key.startswith(f"adapters_{adapters}@")
    }


def print_table(rep: dict) -> None:
    cols = ("output_tokens_per_s", "requests_per_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50",
            "tpot_ms_p99", "itl_ms_p50", "itl_ms_p99")  # fmt: skip
    names = ["tok/s", "req/s", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "itl_p50", "itl_p99"]
    print(f"\n{'run':<18}" + "".join(f"{n:>10}" for n in names) + f"{'x tput':>8}{'x tpot':>8}")
    for key, r in rep["results"].items():
        ratio = rep["vs_base"].get(key, {"throughput": 1.0, "tpot_p50": 1.0})
        row = "".join(f"{r[c]:>10.2f}" for c in cols)
        print(f"{key:<18}{row}{ratio['throughput']:>8.3f}{ratio['tpot_p50']:>8.3f}")
    for key, met in rep["targets"].items():
        print(f"{key}: throughput >= {TARGETS['throughput']}x {met['throughput_ok']}, "
              f"TPOT p50 <= {TARGETS['tpot_p50']}x {met['tpot_ok']}")  # fmt: skip
    load = rep["adapter_load"]
    print(
        f"adapter load: register {load['register_s'] * 1e3:.0f} ms (disk -> host), slot "
        f"{load['slot_load_ms']:.2f} ms (host -> device), {load['slot_bytes'] / 2**20:.0f} MiB a slot; "
        f"adapter changes greedy output: {rep['adapter_effect']['differs']}"
    )


def lora_bench_parser(doc: str, smoke_help: str) -> argparse.ArgumentParser:
    """The options both LoRA trace benches take (this one and bench/lora_churn.py): the engine (8B
    shape, random weights), the report, the trace's lengths, the adapters' rank and registration."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p, "llama-3.1-8b", random_weights=True)
    p.add_argument("--out", dest="json", type=Path, default=None, help="the JSON report (same as --json)")
    add_trace_shape_args(p)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--register-workers", type=int, default=8, help="threads registering a1 onwards")
    p.add_argument("--smoke", action="store_true", help=smoke_help)
    return p


def parser() -> argparse.ArgumentParser:
    p = lora_bench_parser(__doc__, "CPU, SmolLM2, a few short requests, 1 and 2 adapters")
    p.add_argument("--requests", type=int, default=200, help="requests per run")
    p.add_argument("--rates", default="20,inf", help="requests per second; inf = all at once")
    p.add_argument("--adapters", default="1,8,64", help="distinct adapter counts; the largest is the slots")
    return p


def parse(argv: list[str] | None) -> argparse.Namespace:
    return parse_with(argv, parser, SMOKE)


def parse_with(
    argv: list[str] | None, make_parser: Callable[[], argparse.ArgumentParser], smoke: dict
) -> argparse.Namespace:
    """--smoke swaps `make_parser()`'s defaults for `smoke`'s; options given on the command line still
    win (bench/lora_churn.py's parse too)."""
    p = make_parser()
    if p.parse_args(argv).smoke:
        p.set_defaults(**smoke)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    return run_and_report(parse(argv), run, print_table)


if __name__ == "__main__":
    main()
