"""The engine under realistic traffic: Poisson arrivals over a ladder of rates, lognormal lengths, and
a sampling mix like real API traffic, beside the same trace all-greedy, in one run on one engine.

    python -m bench.engine_trace --model llama-3.1-8b --random-weights --device cuda \\
        --requests 600 --rates 10,20,40,inf --json out.json

The trace (fixed by --seed): request i arrives at the i-th event of a Poisson process of the rate
("inf": all at once, the saturation point); its prompt has lognormal length (median
--prompt-median, log-sd --prompt-sigma, clipped to [16, --prompt-max]) and it generates a
lognormal number of tokens (median --output-median, log-sd --output-sigma, clipped to [8,
--output-max]) with EOS ignored, so the mixes do the same work (but for the 5% under a JSON schema,
which end when their object does). The sampling mix (`mixed`) is the load generator's
(loadtest/sampling_mix.py: 20% greedy, 80% tempered with top-p, some top-k, penalties and min-p,
a fifth of them top logprobs 1-20, each with its own seed; 5% n=2, 5% a JSON schema); `greedy`
sends the same trace at temperature 0 (n kept: the same answers' work), and `logprobs20` greedy
with the top 20 logprobs at every token.

Per run it reports output tokens/s, request throughput, and TTFT, TPOT ((E2E - TTFT) / (tokens - 1))
and ITL (the gap between consecutive tokens) at p50 and p99, as `vllm bench serve` defines them,
plus the engine's share of graphed steps. Needs torch, transformers and numpy only (the GPU image).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from loadtest.sampling_mix import engine_fields, sampling_mix
from replica.config import EngineConfig
from replica.engine import Engine
from replica.late_launch import LateLaunch
from replica.sampling_params import SamplingParams


@dataclass
class TraceRequest:
    arrival_s: float
    prompt: list[int]
    output_tokens: int
    mixed: dict  # sampling fields of the mixed run (the greedy run uses temperature 0)


def make_trace(args, vocab: int, rate: float) -> list[TraceRequest]:
    rng = np.random.default_rng(args.seed)  # the same lengths and mix at every rate
    n = args.requests
    prompt_lens = np.clip(
        args.prompt_median * np.exp(args.prompt_sigma * rng.standard_normal(n)), 16, args.prompt_max
    )
    output_lens = np.clip(
        args.output_median * np.exp(args.output_sigma * rng.standard_normal(n)), 8, args.output_max
    )
    mixes = [sampling_mix(rng) for _ in range(n)]
    prompts = [rng.integers(100, vocab - 100, size=int(length)).tolist() for length in prompt_lens]
    gaps = np.zeros(n) if math.isinf(rate) else rng.exponential(1.0 / rate, size=n)
    arrivals = np.cumsum(gaps) - gaps[0]
    return [
        TraceRequest(float(a), p, int(o), m)
        for a, p, o, m in zip(arrivals, prompts, output_lens, mixes, strict=True)
    ]


Tag = Callable[[str | None], str]  # a request's group, from its adapter's name, as it is sent


async def run_trace(
    engine: Engine,
    trace: list[TraceRequest],
    mix: str,
    adapters: Sequence[str | None] = (None,),
    tag: Tag | None = None,
) -> dict:
    """Send the trace at its arrival times; request i names LoRA adapter `adapters[i % len]` (None:
    the base model; bench/lora_trace.py spreads a trace over several). `tag(adapter)`, asked as each
    request is sent, sorts the requests into groups (bench/lora_churn.py: whether its adapter is
    resident then); the result's "ttft_by_tag" has each group's TTFT."""
    engine.core.profiler.records.clear()
    start = time.perf_counter()

    async def one(i: int, req: TraceRequest) -> dict:
        await asyncio.sleep(max(0.0, start + req.arrival_s - time.perf_counter()))
        fields = MIXES[mix](req.mixed)
        params = SamplingParams(max_tokens=req.output_tokens, ignore_eos=True, **fields)
        adapter = adapters[i % len(adapters)]
        label = tag(adapter) if tag is not None else None
        sent = time.perf_counter()
        stamps: list[float] = []  # answer 0's token times (n > 1 answers interleave)
        tokens = 0
        async for out in engine.generate(req.prompt, params, request_id=f"{mix}-{i}-{sent}", adapter=adapter):
            tokens += len(out.token_ids)
            if out.index == 0:
                stamps.extend([time.perf_counter()] * len(out.token_ids))
        return {"sent": sent, "stamps": stamps, "tokens": tokens, "tag": label}

    done = await asyncio.gather(*(one(i, r) for i, r in enumerate(trace)))
    wall = max(d["stamps"][-1] for d in done) - start
    result = summarise(done, wall, engine.profile_summary())
    if tag is not None:
        result["ttft_by_tag"] = ttft_by_tag(done)
    return result


def greedy_twin(mixed: dict) -> dict:
    """The same request all-greedy: as many answers (the same work), no logprobs, no schema."""
    return {"temperature": 0.0, **({"n": mixed["n"]} if "n" in mixed else {})}


# How each run sends a request of the trace: the mix's own fields (or those but the JSON schemas,
# to see what the schemas' token masks cost), greedy, or greedy asking the top 20 logprobs at
# every token (an evaluation harness's traffic).
MIXES = {
    "mixed": engine_fields,
    "mixed_noschema": lambda mixed: engine_fields({k: v for k, v in mixed.items() if k != "response_format"}),
    "greedy": greedy_twin,
    "logprobs20": lambda mixed: {**greedy_twin(mixed), "logprobs": 20},
}


def summarise(done: list[dict], wall: float, profile: dict) -> dict:
    tokens = sum(d.get("tokens", len(d["stamps"])) for d in done)
    ttft = [(d["stamps"][0] - d["sent"]) * 1e3 for d in done]
    tpot = [
        (d["stamps"][-1] - d["stamps"][0]) / (len(d["stamps"]) - 1) * 1e3
        for d in done
        if len(d["stamps"]) > 1
    ]
    itl = np.concatenate([np.diff(d["stamps"]) * 1e3 for d in done if len(d["stamps"]) > 1])
    pct = lambda values, q: float(np.percentile(values, q))  # noqa: E731
    return {
        "wall_s": wall,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / wall,
        "requests_per_s": len(done) / wall,
        **{f"ttft_ms_p{q}": pct(ttft, q) for q in (50, 99)},
        **{f"tpot_ms_p{q}": pct(tpot, q) for q in (50, 99)},
        **{f"itl_ms_p{q}": pct(itl, q) for q in (50, 99)},
        "itl_ms_max": float(itl.max()),
        "graphed_fraction": profile.get("graphed_fraction"),
        "step_kinds": profile.get("kinds"),
        "device_busy_fraction": profile.get("device_busy_fraction"),
        "steps": profile.get("steps"),
        # Mean host and device milliseconds per step, by phase (replica/profiler.py's fields).
        "step_ms_mean": {k: v["mean"] for k, v in profile.items() if isinstance(v, dict) and "mean" in v},
    }


def ttft_by_tag(done: list[dict]) -> dict[str, dict]:
    """Each tag's request count and TTFT p50, p99 and max (run_trace's `tag`)."""
    groups: dict[str, list[float]] = {}
    for d in done:
        groups.setdefault(d["tag"], []).append((d["stamps"][0] - d["sent"]) * 1e3)
    return {
        tag: {"requests": len(ttft), **{f"ttft_ms_p{q}": float(np.percentile(ttft, q)) for q in (50, 99)},
              "ttft_ms_max": max(ttft)}
        for tag, ttft in sorted(groups.items())
    }  # fmt: skip


def engine_config(args, **extra) -> EngineConfig:
    """The engine `add_engine_args`'s options describe, with `extra` fields (LoRA slots, say)."""
    return EngineConfig(
        model=args.model, device=args.device, random_weights=args.random_weights,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens,
        enable_prefix_caching=args.prefix_caching, context_cuda_graphs=args.context_graphs,
        quantization=args.quantization, kv_cache_dtype=args.kv_cache_dtype, **extra,
    )  # fmt: skip


def loaded_model(engine: Engine) -> dict:
    """What the report says of the started engine's model."""
    loaded = engine.loaded
    return {"source": loaded.source, "architecture": getattr(loaded, "architecture", None),
            "load_seconds": getattr(loaded, "load_seconds", None)}  # fmt: skip


async def run(args) -> dict:
    engine = Engine(engine_config(args))
    await engine.start()
    model = loaded_model(engine)
    print(f"[trace] loaded {model}", flush=True)
    vocab = engine.loaded.config.vocab_size
    if engine.loaded.tokenizer is None and "mixed" in args.mixes.split(","):
        from bench.bpe_vocab import attach  # random weights ship no tokenizer; the mix's schemas need one

        attach(engine)
        if args.prepare_grammars:  # as a CUDA engine with its own tokenizer does in start
            await engine.prepare_grammars()
    warm = make_trace(args, vocab, math.inf)[:8]
    await run_trace(engine, warm, "mixed")
    results: dict[str, dict] = {}
    records: dict[str, list[dict]] = {}
    try:
        variants = {
            "default": (("", engine.core.late),),
            "off": (("", None),),
            "both": (("late", engine.core.late or LateLaunch()), ("early", None)),  # on the CPU too
        }[args.late_launch]
        for rate_name in args.rates.split(","):
            rate = math.inf if rate_name == "inf" else float(rate_name)
            trace = make_trace(args, vocab, rate)
            for mix, (suffix, launch) in itertools.product(args.mixes.split(","), variants):
                key = f"{mix}@{rate_name}" + (f":{suffix}" if suffix else "")
                engine.core.late = launch  # between runs: the loop is idle, and reads it per step
                results[key] = await run_trace(engine, trace, mix)
                if args.step_records:  # every step of every run, for a profile of where gaps fall
                    records[key] = [asdict(r) for r in engine.core.profiler.records]
                    args.step_records.write_text(json.dumps(records))
                print(f"[trace] {key}: {results[key]['output_tokens_per_s']:.0f} tok/s", flush=True)
                if args.json:  # after every run: a run cut off by its time limit still reports
                    args.json.write_text(json.dumps(report(args, results, model), indent=2, default=str))
    finally:
        await engine.stop()
    return report(args, results, model)


def report(args, results: dict[str, dict], model: dict) -> dict:
    ratios = {}
    for key, r in results.items():
        mix, rate = key.split("@")
        greedy = results.get("greedy@" + rate)
        if mix != "greedy" and greedy:
            ratios[key if mix != "mixed" else rate] = {
                "throughput": r["output_tokens_per_s"] / greedy["output_tokens_per_s"],
                "tpot_p50": r["tpot_ms_p50"] / greedy["tpot_ms_p50"],
                "ttft_p99": r["ttft_ms_p99"] / greedy["ttft_ms_p99"],
            }
    return {**report_header(args, model), "results": results, "mixed_vs_greedy": ratios}


def report_header(args, model: dict) -> dict:
    """When, where and with what a report was made (every engine trace report starts with it)."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": platform.node(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "args": vars(args),
        "model": model,
    }


def print_table(rep: dict) -> None:
    cols = ("output_tokens_per_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "itl_ms_p50",
            "itl_ms_p99", "graphed_fraction")  # fmt: skip
    names = [
        c.replace("_ms", "").replace("output_tokens_per_s", "tok/s").replace("_fraction", "") for c in cols
    ]
    print(f"\n{'run':<14}" + "".join(f"{name:>12}" for name in names))
    for name, r in rep["results"].items():
        print(f"{name:<14}" + "".join(f"{(r.get(c) or 0):>12.2f}" for c in cols))
    for run, ratio in rep["mixed_vs_greedy"].items():
        name = run if "@" in run else f"mixed@{run}"
        print(
            f"{name} / greedy: throughput {ratio['throughput']:.3f}x, TPOT p50 {ratio['tpot_p50']:.3f}x, "
            f"TTFT p99 {ratio['ttft_p99']:.3f}x"
        )


def add_engine_args(
    p: argparse.ArgumentParser, model: str | None, caching_flag: bool = True, random_weights: bool = False
) -> None:
    """The engine and run options every engine benchmark takes; `caching_flag` False leaves out
    --prefix-caching, for a benchmark that sets caching itself (bench/prefix_cache.py runs both);
    `random_weights` True makes random weights the default (--no-random-weights turns them off)."""
    p.add_argument("--model", default=model)
    p.add_argument("--random-weights", action=argparse.BooleanOptionalAction, default=random_weights)
    p.add_argument("--device", default="auto")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-batched-tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument(
        "--quantization", choices=("fp8",), default=None, help="FP8 weights (default: the model's)"
    )
    p.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    p.add_argument(
        "--context-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="graph steps whose chunks continue their sequences (the engine's default: on)",
    )
    # Off by default: these benchmarks replay one trace several times on one engine, and a later run
    # would find the earlier run's prompts cached (bench/prefix_cache.py measures the cache itself).
    if caching_flag:
        p.add_argument("--prefix-caching", action="store_true", help="keep automatic prefix caching on")


def add_trace_shape_args(p: argparse.ArgumentParser) -> None:
    """The lognormal prompt and output lengths `make_trace` draws."""
    p.add_argument("--prompt-median", type=float, default=400)
    p.add_argument("--prompt-sigma", type=float, default=0.8)
    p.add_argument("--prompt-max", type=int, default=3000)
    p.add_argument("--output-median", type=float, default=200)
    p.add_argument("--output-sigma", type=float, default=0.7)
    p.add_argument("--output-max", type=int, default=1200)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p, "smollm2-135m")
    add_trace_shape_args(p)
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--rates", default="10,20,40,inf", help="requests per second; inf = all at once")
    p.add_argument(
        "--mixes", default="greedy,mixed", help="sampling mixes to run, of greedy,mixed,logprobs20 (MIXES)"
    )
    p.add_argument(
        "--prepare-grammars",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="build the schemas' tokenizer view before the runs (off: the first schema builds it)",
    )
    p.add_argument("--step-records", type=Path, default=None, help="every run's per-step records (JSON)")
    p.add_argument(
        "--late-launch",
        choices=("default", "off", "both"),
        default="default",
        help="plan steps late (replica/late_launch.py) as the engine's default, never, or both (A/B)",
    )
    return p


def run_and_report(args, run_bench, table) -> dict:
    """Run a trace bench (`run_bench(args)`), write its report to --json (its folder made first, so a
    bad path fails before the run) and print `table(report)`."""
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
    rep = asyncio.run(run_bench(args))
    if args.json:
        args.json.write_text(json.dumps(rep, indent=2, default=str))
    table(rep)
    return rep


def main(argv: list[str] | None = None) -> dict:
    return run_and_report(parser().parse_args(argv), run, print_table)


if __name__ == "__main__":
    main()
