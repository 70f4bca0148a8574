"""Overhead of the Serve path: tokens/s and TTFT through HTTP + router + replica vs the engine alone.

    python -m bench.serve_overhead --json out.json [--concurrency 8] [--requests 24] [--max-tokens 32]

Both sides run the same greedy requests (same prompts, same lengths) on the same model, one after
the other on this machine (the engine alone first, then stopped, so they never share the CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx

from cluster.config import AppConfig
from cluster.ops.local_cluster import free_port, local_cluster
from replica import Engine, EngineConfig, SamplingParams
from tenancy import DEMO_KEYS

PROMPTS = [f"Write a short note about the number {i}." for i in range(64)]


async def _engine_side(args: argparse.Namespace) -> dict:
    engine = Engine(EngineConfig(model=args.model, device=args.device, kv_cache_tokens=args.kv_tokens))
    await engine.start()
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
        ids = [engine.tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS[: args.requests]]

        async def one(prompt: list[int]) -> tuple[float, int]:
            start, first, n = time.perf_counter(), None, 0
            async for out in engine.generate(prompt, params):
                first = first or time.perf_counter() - start
                n = out.num_output_tokens
            return first, n

        ttft = [(await one(ids[i]))[0] for i in range(args.ttft_requests)]
        return await _throughput(ids, one, args.concurrency) | {"ttft_p50_s": statistics.median(ttft)}
    finally:
        await engine.stop()


async def _throughput(prompts: list, one, concurrency: int) -> dict:
    sem = asyncio.Semaphore(concurrency)

    async def bounded(p) -> int:
        async with sem:
            return (await one(p))[1]

    start = time.perf_counter()
    tokens = sum(await asyncio.gather(*(bounded(p) for p in prompts)))
    wall = time.perf_counter() - start
    return {"output_tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall}


async def _serve_side(base: str, args: argparse.Namespace) -> dict:
    headers = {"Authorization": f"Bearer {DEMO_KEYS['alice']}"}
    async with httpx.AsyncClient(base_url=base, timeout=600, headers=headers) as client:

        async def one(prompt: str, stream: bool = False) -> tuple[float, int]:
            body = {
                "model": args.model,
                "prompt": prompt,
                "max_tokens": args.max_tokens,
                "temperature": 0.0,
                "stream": stream,
                "stream_options": {"include_usage": True} if stream else None,
            }
            body = {k: v for k, v in body.items() if v is not None}
            start = time.perf_counter()
            if not stream:
                r = await client.post("/v1/completions", json=body)
                return 0.0, r.json()["usage"]["completion_tokens"]
            first = None
            async with client.stream("POST", "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if first is None and line.startswith("data: {"):
                        first = time.perf_counter() - start
            return first, 0

        await one(PROMPTS[0])  # warm the path
        ttft = [(await one(PROMPTS[i], stream=True))[0] for i in range(args.ttft_requests)]
        return await _throughput(PROMPTS[: args.requests], one, args.concurrency) | {
            "ttft_p50_s": statistics.median(ttft)
        }


def run(args: argparse.Namespace) -> dict:
    engine = asyncio.run(_engine_side(args))
    cfg = AppConfig.model_validate(
        {
            "engine": {
                "model": args.model,
                "device": args.device,
                "kv_cache_tokens": args.kv_tokens,
                "max_num_seqs": args.concurrency,  # every request in one batch, as the engine side runs
            },
            "replica_room": args.concurrency,
            "port": free_port(),
            "served_model_name": args.model,
        }
    )
    with local_cluster(cfg) as base:
        served = asyncio.run(_serve_side(base, args))
    return {
        "engine": engine,
        "serve": served,
        "throughput_ratio": served["tokens_per_s"] / engine["tokens_per_s"],
        "ttft_added_s": served["ttft_p50_s"] - engine["ttft_p50_s"],
        "args": vars(args),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, required=True, help="Where to write the results.")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--ttft-requests", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--kv-tokens", type=int, default=8192)
    args = p.parse_args()
    result = run(args)
    args.json.write_text(json.dumps(result, indent=2, default=str))
    e, s = result["engine"], result["serve"]
    print(f"engine alone: {e['tokens_per_s']:.1f} tok/s, TTFT p50 {e['ttft_p50_s'] * 1000:.0f} ms")
    print(f"serve path:   {s['tokens_per_s']:.1f} tok/s, TTFT p50 {s['ttft_p50_s'] * 1000:.0f} ms")
    print(f"ratio {result['throughput_ratio']:.3f}; TTFT added {result['ttft_added_s'] * 1000:.0f} ms")


if __name__ == "__main__":
    main()
