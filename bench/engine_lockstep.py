"""Engine benchmark: our engine (async and sync) against transformers, side by side in one run.

    python -m bench.engine_lockstep --model smollm2-135m --device cpu --concurrency 16
        --max-tokens 128 --json o.json

Every request generates exactly --max-tokens tokens (EOS ignored), so modes do the same work.
--sampling runs each engine mode under several profiles (greedy; sampled: temperature 0.8, top-p
0.9; logprobs: sampled with the top 5 logprobs of every token), side by side; a profile other than
greedy reports its mode as e.g. "async-sampled". Modes:
async / sync: this engine; hf: transformers `generate` on the whole batch at once (padded);
hf-single: transformers `generate`, one request at a time (the single-stream figure); hf-cb:
transformers' own continuous batching (`generate_batch`, async batching on; run first, in a child
process with its own time limit, so it gets the whole GPU and a stall cannot sink the run); prepare:
host time to plan and fill one decode step at --batch sequences, alone (`host_prepare.py`).
Runs with torch, transformers and numpy alone, so it works on the GPU machine's image too.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from bench.engine_baselines import hf_cb_in_child, load_only, run_hf, run_hf_cb
from bench.roofline import roofline
from replica.config import EngineConfig
from replica.decode_flags import add_decode_flags, decode_config
from replica.engine import Engine
from replica.sampling_params import SamplingParams

MODES = ("async", "sync", "hf", "hf-single", "hf-cb", "prepare")
PROFILES = {
    "greedy": dict(temperature=0.0),
    "sampled": dict(temperature=0.8, top_p=0.9),
    "logprobs": dict(temperature=0.8, top_p=0.9, logprobs=5),
}


def make_prompts(vocab: int, count: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(100, vocab - 100, size=length).tolist() for _ in range(count)]


async def run_engine(args, mode: str, profile: str = "greedy") -> dict:
    config = EngineConfig(
        model=args.model,
        device=args.device,
        mode=mode,
        random_weights=args.random_weights,
        max_num_seqs=max(args.concurrency, 1),
        max_num_batched_tokens=args.max_batched_tokens,
        gil_switch_interval_ms=args.gil_switch_ms,
        mixed_cuda_graphs=not args.no_mixed_graphs,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        **decode_config(args),
    )
    engine = Engine(config)
    await engine.start()
    prompts = make_prompts(engine.loaded.config.vocab_size, args.concurrency, args.prompt_len)
    params = [
        SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, seed=i, **PROFILES[profile])
        for i in range(len(prompts))
    ]
    await _drive(engine, prompts[:2], params[:2], max_tokens=4)  # warm-up
    runs = []
    for _ in range(args.repeats):  # the same batch again on the same engine: run-to-run spread
        engine.core.profiler.records.clear()  # the engine is idle now: profile only the timed run
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        per_request = await _drive(engine, prompts, params)
        wall = time.perf_counter() - start
        runs.append((wall, per_request, list(engine.core.profiler.records), engine.profile_summary()))
    runs.sort(key=lambda run: run[0])
    wall, per_request, records, summary = runs[len(runs) // 2]  # the median run's figures
    result = _summarise(mode, per_request, wall, summary)
    result["sampling"] = {"profile": profile, **PROFILES[profile]}
    result["mixed_graph_replays"] = engine.core.runner.mixed_replays  # warm-up and every run
    result["runs_tok_s"] = [round(sum(len(r["tokens"]) for r in run[1]) / run[0], 1) for run in runs]
    result["prefill_steps"] = [  # (prefill tokens, rows, device ms, host launch ms) of prefill steps
        (r.num_prefill_tokens, r.batch_size, round(r.compute_ms, 3), round(r.launch_ms, 3))
        for r in records
        if r.num_prefill_tokens
    ]
    result["outputs"] = [r["tokens"] for r in per_request]
    result["kv_blocks"] = engine.stats().kv_blocks_total
    if torch.cuda.is_available():
        result["peak_gpu_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        result["roofline"] = roofline(engine.loaded, args, result["output_tokens_per_s"])
    await engine.stop()
    return result


async def _drive(engine: Engine, prompts, params: list[SamplingParams], max_tokens: int = 0) -> list[dict]:
    async def one(i: int, prompt) -> dict:
        sent = time.perf_counter()
        stamps, tokens = [], []
        p = (
            params[i]
            if not max_tokens
            else SamplingParams(**{**_fields(params[i]), "max_tokens": max_tokens})
        )
        async for out in engine.generate(prompt, p, request_id=f"bench-{i}-{sent}"):
            now = time.perf_counter()
            stamps.extend([now] * len(out.token_ids))
            tokens.extend(out.token_ids)
        return {"sent": sent, "stamps": stamps, "tokens": tokens}

    # Every request is admitted before the first step, so async and sync start from the same batches.
    engine.hold()
    tasks = [asyncio.create_task(one(i, p)) for i, p in enumerate(prompts)]
    while engine.open_streams < len(prompts):
        await asyncio.sleep(0)
    engine.release()
    return await asyncio.gather(*tasks)


def _fields(params: SamplingParams) -> dict:
    return {name: getattr(params, name) for name in params.__dataclass_fields__}


def _summarise(mode: str, per_request: list[dict], wall: float, profile: dict) -> dict:
    total = sum(len(r["tokens"]) for r in per_request)
    tpot = [
        (r["stamps"][-1] - r["stamps"][0]) / (len(r["stamps"]) - 1) * 1000.0
        for r in per_request
        if len(r["stamps"]) > 1
    ]
    ttft = [(r["stamps"][0] - r["sent"]) * 1000.0 for r in per_request if r["stamps"]]
    return {
        "mode": mode,
        "output_tokens": total,
        "wall_s": wall,
        "output_tokens_per_s": total / wall,
        "tpot_ms_p50": _pct(tpot, 50),
        "tpot_ms_p99": _pct(tpot, 99),
        "ttft_ms_p50": _pct(ttft, 50),
        "mean_step_ms": _step_ms(profile),
        "decode_host_prepare_ms_p50": profile.get("decode_host_prepare_ms", {}).get("p50"),
        "decode_host_prepare_ms_p99": profile.get("decode_host_prepare_ms", {}).get("p99"),
        "device_busy_fraction": profile.get("device_busy_fraction"),
        "decode_device_busy_fraction": profile.get("decode_device_busy_fraction"),
        "profile": profile,
    }


def _step_ms(profile: dict) -> float | None:
    parts = ("schedule_ms", "prepare_ms", "compute_ms", "postprocess_ms")
    if "compute_ms" not in profile:
        return None
    return sum(profile[p]["mean"] for p in parts)


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run(args) -> dict:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - set(MODES)
    if unknown:
        raise SystemExit(f"unknown modes {sorted(unknown)}; choose from {MODES}")
    results: dict[str, dict] = {}
    if "hf-cb" in modes and not args.in_child:
        results["hf-cb"] = hf_cb_in_child(args)
        _progress(args, results, "hf-cb")
    if "prepare" in modes:
        from replica.host_prepare import measure

        results["prepare"] = measure(args.concurrency, args.prompt_len)
        _progress(args, results, "prepare")
    for profile in args.sampling.split(","):
        for mode in [m for m in modes if m in ("async", "sync")]:
            name = mode if profile == "greedy" else f"{mode}-{profile}"
            results[name] = asyncio.run(run_engine(args, mode, profile))
            _progress(args, results, name)
            _release_memory()
    hf_modes = [m for m in modes if m.startswith("hf") and (m != "hf-cb" or args.in_child)]
    if hf_modes:
        loaded = load_only(args)  # same preset and seed: the same weights the engine ran
        prompts = make_prompts(loaded.config.vocab_size, args.concurrency, args.prompt_len)
        for mode in hf_modes:
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            try:
                results[mode] = (
                    run_hf_cb(args, loaded, prompts)
                    if mode == "hf-cb"
                    else run_hf(args, loaded, prompts, mode == "hf")
                )
            except (
                Exception
            ) as exc:  # a baseline the installed transformers cannot run is reported, not fatal
                results[mode] = {"mode": mode, "error": repr(exc)[:500], "output_tokens_per_s": float("nan")}
            if torch.cuda.is_available():
                results[mode]["peak_gpu_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
            _progress(args, results, mode)
            _release_memory()
    return _report(args, results)


def _progress(args, results: dict[str, dict], mode: str) -> None:
    """Print each mode as it finishes and keep the JSON current, so a cut-off run still reports."""
    r = results[mode]
    print(
        f"[bench] {mode}: {r.get('output_tokens_per_s', float('nan')):.1f} tok/s {r.get('error', '')}",
        flush=True,
    )
    if args.json:
        args.json.write_text(json.dumps(_report(args, results), indent=2, default=str))


def _release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _report(args, results: dict[str, dict]) -> dict:
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": platform.node(),
        "cpu_count": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "args": vars(args),
        "results": {m: {k: v for k, v in r.items() if k != "outputs"} for m, r in results.items()},
        "outputs_first_tokens": {
            m: [o[:16] for o in r["outputs"]] for m, r in results.items() if "outputs" in r
        },
        "ratios": {},
        "greedy_agreement": {},
    }
    baselines = [m for m in ("hf", "hf-single", "hf-cb") if "error" not in results.get(m, {"error": 1})]
    for mode in ("async", "sync"):
        for base in baselines if mode in results else []:
            ratio = results[mode]["output_tokens_per_s"] / results[base]["output_tokens_per_s"]
            report["ratios"][f"{mode}_vs_{base}"] = ratio
    for profile in ("", "-sampled", "-logprobs"):
        if f"async{profile}" in results and f"sync{profile}" in results:
            report["ratios"][f"async_vs_sync{profile}"] = (
                results[f"async{profile}"]["output_tokens_per_s"]
                / results[f"sync{profile}"]["output_tokens_per_s"]
            )
    for mode in ("async", "sync"):
        for profile, base in (("sampled", mode), ("logprobs", f"{mode}-sampled")):
            if f"{mode}-{profile}" in results and base in results:
                ratio = (
                    results[f"{mode}-{profile}"]["output_tokens_per_s"] / results[base]["output_tokens_per_s"]
                )
                report["ratios"][f"{mode}_{profile}_vs_{base}"] = ratio
    if "async" in results and "sync" in results:
        same = [a == b for a, b in zip(results["async"]["outputs"], results["sync"]["outputs"], strict=True)]
        report["greedy_agreement"]["async_equals_sync"] = all(same)
    for hf_mode in ("hf", "hf-single"):
        if "async" in results and "outputs" in results.get(hf_mode, {}):
            div = [
                first_divergence(a, b)
                for a, b in zip(results["async"]["outputs"], results[hf_mode]["outputs"], strict=False)
            ]
            report["greedy_agreement"][f"first_divergence_vs_{hf_mode}"] = div
    return report


def print_table(report: dict) -> None:
    head = f"{'tok/s':>10} {'wall s':>8} {'TPOT p50 ms':>12} {'step ms':>9} {'busy':>6} {'graphed':>7}"
    print(f"\n{'mode':<16} {head}")
    for mode, r in report["results"].items():
        if mode == "prepare":
            h = r["host_prepare_ms"]
            seqs = r["num_seqs"]
            print(f"{mode:<10} host prepare at {seqs} seqs: p50 {h['p50']:.3f} ms, p99 {h['p99']:.3f} ms")
            continue
        if "error" in r:
            print(f"{mode:<10} error: {r['error'][:100]}")
            continue
        step = r.get("mean_step_ms")
        busy = r.get("device_busy_fraction")
        step = float("nan") if step is None else step
        busy = float("nan") if busy is None else busy
        tpot = r.get("tpot_ms_p50") or 0.0
        graphed = r.get("profile", {}).get("graphed_fraction", float("nan"))
        print(
            f"{mode:<16} {r['output_tokens_per_s']:>10.1f} {r['wall_s']:>8.2f} "
            f"{tpot:>12.2f} {step:>9.2f} {busy:>6.2f} {graphed:>7.2f}"
        )
    for name, value in report["ratios"].items():
        print(f"{name}: {value:.2f}x")
    for name, value in report["greedy_agreement"].items():
        print(f"{name}: {value}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--random-weights", action="store_true")
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--quantization", choices=("fp8",), default=None, help="FP8 weights (default: the model's)"
    )
    p.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    p.add_argument("--concurrency", "--batch", type=int, default=16, dest="concurrency")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--max-batched-tokens", type=int, default=2048)
    p.add_argument("--modes", default="async,sync,hf-single")
    p.add_argument("--sampling", default="greedy", help=f"profiles, comma-separated: {', '.join(PROFILES)}")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per engine mode (median kept)")
    p.add_argument("--no-mixed-graphs", action="store_true", help="run mixed steps eagerly")
    add_decode_flags(p)
    p.add_argument("--gil-switch-ms", type=float, default=0.5, help="the engine's GIL switch interval")
    p.add_argument("--hf-requests", type=int, default=4, help="requests timed in hf-single mode")
    p.add_argument("--hf-cb-timeout", type=float, default=240.0, help="seconds for the hf-cb child")
    p.add_argument("--in-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, default=None)
    return p


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    report = run(args)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    print_table(report)
    return report


if __name__ == "__main__":
    main()
