"""FP8 KV cache against the model-dtype cache (issue 45 part 2): pool blocks, concurrent 4k-token
sequences, and decode throughput at that concurrency, one engine after the other in one process.

    python -m bench.fp8_kv --out $OUT/fp8_kv.json [--model llama-3.1-8b] [--seq-tokens 4096]
    python -m bench.fp8_kv --smoke --out /tmp/fp8_kv.json      # CPU, SmolLM2 shape, seconds

For each `kv_cache_dtype` ("auto" = bf16, then "fp8"), random weights of `--model`: the engine sizes
its pool from the memory free after the weights (replica/engine_sizes.py; the cache dtype's bytes
per block). Its capacity is `kv_tokens // seq_tokens` sequences of `seq_tokens` tokens (prompt
`seq_tokens - max_tokens`, then `max_tokens` greedy tokens, ignore_eos). That many requests run in
lockstep (admitted together, `max_num_seqs` set to the count, capped by `--max-seqs`): decode tok/s
counts the tokens after each request's first over the time from the last first token to the end,
so the prefill of the long prompts is left out. Decode graphs cover batches up to 256 (the ladder,
replica/cuda_graphs.py); a larger batch runs eager steps.

--smoke runs the "auto" half on the CPU (SmolLM2 shape, a small pool, short sequences); the fp8
half is skipped there with the reason (an FP8 cache needs compute capability >= 8.9) and its pool
is given by the sizing rule alone (`fp8_blocks_by_rule`: the same free memory, half the bytes).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from bench.engine_lockstep import make_prompts
from replica import Engine, EngineConfig, SamplingParams
from replica.engine_sizes import choose_sizes
from replica.errors import UnsupportedDeviceError
from replica.model_runner import ModelRunner


def _decode_rate(stamps: list[list[float]]) -> tuple[float, float]:
    """(decode tok/s after every request's first token, seconds of that phase)."""
    start = max(s[0] for s in stamps)
    end = max(s[-1] for s in stamps)
    tokens = sum(sum(1 for t in s[1:] if t > start) for s in stamps)
    return (tokens / (end - start) if end > start else 0.0), end - start


async def _lockstep(engine: Engine, count: int, prompt_len: int, max_tokens: int) -> dict:
    prompts = make_prompts(engine.loaded.config.vocab_size, count, prompt_len)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)

    async def one(i: int) -> list[float]:
        stamps: list[float] = []
        async for out in engine.generate(prompts[i], params, request_id=f"fp8kv-{i}-{time.time()}"):
            stamps.extend([time.perf_counter()] * len(out.token_ids))
        return stamps

    engine.hold()  # every request admitted before the first step
    tasks = [asyncio.create_task(one(i)) for i in range(count)]
    while engine.open_streams < count:
        await asyncio.sleep(0)
    start = time.perf_counter()
    engine.release()
    stamps = await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    rate, decode_s = _decode_rate(stamps)
    return {
        "requests": count,
        "output_tokens": sum(len(s) for s in stamps),
        "wall_s": round(wall, 3),
        "decode_s": round(decode_s, 3),
        "decode_tok_s": round(rate, 1),
        "preemptions": engine.stats().num_preemptions,
    }


async def run_one(args, kv: str) -> dict:
    base = dict(model=args.model, random_weights=True, kv_cache_dtype=kv, device=args.device)
    if args.smoke:
        base |= dict(kv_cache_tokens=args.smoke_kv_tokens)
    # The pool is sized before any graph is captured: a graphless probe finds the size the run gets.
    probe = Engine(EngineConfig(**base, max_num_seqs=1, cuda_graphs=False))
    await probe.start()
    sizes = probe.sizes
    per_block = ModelRunner.kv_bytes_per_block(probe.loaded.model, sizes.block_size, probe.kv_dtype)
    await probe.stop()
    del probe
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    capacity = sizes.kv_tokens // args.seq_tokens
    count = min(capacity, args.max_seqs) if args.max_seqs else capacity
    result = {
        "kv_cache_dtype": kv,
        "kv_blocks": sizes.num_kv_blocks,
        "kv_tokens": sizes.kv_tokens,
        "kv_bytes_per_block": per_block,
        "max_concurrent_seqs": capacity,
    }
    if torch.cuda.is_available():
        result["device"] = torch.cuda.get_device_name()
    engine = Engine(EngineConfig(**base, max_num_seqs=count, num_kv_blocks=sizes.num_kv_blocks))
    await engine.start()
    try:
        result |= await _lockstep(engine, count, args.seq_tokens - args.max_tokens, args.max_tokens)
        result["describe"] = engine.describe()
    finally:
        await engine.stop()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def _run_one_here(args, kv: str) -> dict:
    return asyncio.run(run_one(args, kv))


async def run_isolated(args, kv: str) -> dict:
    """`run_one` in a process of its own: each half sizes its pool from a device holding nothing of
    the other's (run one after the other in one process, the fp8 half found about the 8B shape's
    weights less free memory, 1.5x the blocks, not 2x: the first engine's memory was not all given
    back)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return await asyncio.get_running_loop().run_in_executor(pool, _run_one_here, args, kv)


def fp8_blocks_by_rule(bf16: dict, free_bytes: int) -> int:
    """The pool an FP8 cache gets from the same free memory by replica/engine_sizes.py's rule."""
    half = bf16["kv_bytes_per_block"] // 2
    sizes = choose_sizes(
        on_cuda=True, block_size=16, max_num_seqs=None, max_num_batched_tokens=None, num_kv_blocks=None,
        cpu_kv_tokens=0, free_bytes=free_bytes, kv_bytes_per_block=half,
    )  # fmt: skip
    return sizes.num_kv_blocks


async def main_async(args) -> dict:
    results: dict = {"model": args.model, "seq_tokens": args.seq_tokens, "max_tokens": args.max_tokens}
    results["auto"] = await run_isolated(args, "auto")  # no CUDA context here: the halves get the card
    results["device"] = results["auto"].get("device", "cpu")
    try:
        results["fp8"] = await run_isolated(args, "fp8")
    except UnsupportedDeviceError as exc:
        if not args.smoke:
            raise
        results["fp8"] = {"skipped": f"{exc} (smoke run on the CPU: the fp8 half needs a GPU)"}
        free = results["auto"]["kv_blocks"] * results["auto"]["kv_bytes_per_block"]
        results["fp8_blocks_by_rule"] = fp8_blocks_by_rule(results["auto"], int(free / 0.85) + 1)
    if "max_concurrent_seqs" in results["fp8"]:
        a, f = results["auto"], results["fp8"]
        results["ratio"] = {
            "blocks": round(f["kv_blocks"] / a["kv_blocks"], 3),
            "max_concurrent_seqs": round(f["max_concurrent_seqs"] / max(1, a["max_concurrent_seqs"]), 3),
            "decode_tok_s": round(f["decode_tok_s"] / a["decode_tok_s"], 3) if a["decode_tok_s"] else None,
        }
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: llama-3.1-8b (smoke: smollm2-135m)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seq-tokens", type=int, default=None, help="tokens per sequence (default 4096)")
    parser.add_argument("--max-tokens", type=int, default=None, help="generated per sequence (default 64)")
    parser.add_argument("--max-seqs", type=int, default=0, help="cap the lockstep batch (0: the capacity)")
    parser.add_argument("--smoke", action="store_true", help="CPU, small: checks the script runs")
    parser.add_argument("--smoke-kv-tokens", type=int, default=2048)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.model = args.model or ("smollm2-135m" if args.smoke else "llama-3.1-8b")
    args.seq_tokens = args.seq_tokens or (256 if args.smoke else 4096)
    args.max_tokens = args.max_tokens or (8 if args.smoke else 64)
    if args.smoke:
        args.device = "cpu"
    results = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    summary = {k: results[k] for k in ("ratio",) if k in results}
    for kv in ("auto", "fp8"):
        row = results[kv]
        keep = ("kv_blocks", "max_concurrent_seqs", "decode_tok_s", "wall_s", "skipped")
        summary[kv] = {k: row[k] for k in keep if k in row}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
