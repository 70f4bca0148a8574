"""Where a step's time goes: top kernels (device) and top ops (host) from torch.profiler (CUDA only).

python -m bench.kernel_profile --model llama-3.1-8b --random-weights --batch 32 --json out.json

Phases: `decode` (steady decode, CUDA graphs), `prefill` (prompts only), `mixed` (prompts arrive
while others decode: the eager steps of a serving replica, whose host launch time is the question).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from bench.engine_lockstep import make_prompts
from replica.config import EngineConfig
from replica.decode_flags import add_decode_flags, decode_config
from replica.engine import Engine
from replica.sampling_params import SamplingParams


async def _profile(args) -> dict:
    config = EngineConfig(
        model=args.model,
        random_weights=args.random_weights,
        device="cuda",
        max_num_batched_tokens=args.max_batched_tokens,
        **decode_config(args),
    )
    engine = Engine(config)
    await engine.start()
    prompts = make_prompts(engine.loaded.config.vocab_size, args.batch, args.prompt_len)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)

    async def one(i: int) -> None:
        async for _ in engine.generate(prompts[i], params):
            pass

    window: list[float] = []  # host clock span of the profiled steps (mixed phase)
    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if args.phase == "mixed" else [])
    if args.phase == "prefill":  # prompts only (one token each): the profile holds prefill steps
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        await asyncio.gather(*(one(i) for i in range(args.batch)))  # warm-up: same shapes
        steps_before = engine.stats().steps
        with profile(activities=activities) as prof:
            await asyncio.gather(*(one(i) for i in range(args.batch)))
        steps = engine.stats().steps - steps_before
    elif args.phase == "mixed":  # half the batch decodes; the other half arrives a prompt per step
        first = [asyncio.create_task(one(i)) for i in range(args.batch // 2)]
        await asyncio.sleep(args.settle_s)
        steps_before = engine.stats().steps
        window.append(time.monotonic())
        with profile(activities=activities) as prof:
            later = [await one_prompt_step(engine, one, i) for i in range(args.batch // 2, args.batch)]
        steps = engine.stats().steps - steps_before
        window.append(time.monotonic())
        await asyncio.gather(*first, *later)
    else:
        tasks = [asyncio.create_task(one(i)) for i in range(args.batch)]
        await asyncio.sleep(args.settle_s)  # past the prefills: steady decode
        steps_before = engine.stats().steps
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            await asyncio.sleep(args.window_s)
        steps = engine.stats().steps - steps_before
        await asyncio.gather(*tasks)
    records = [r for r in engine.core.profiler.records if window and window[0] <= r.at <= window[-1]]
    await engine.stop()
    rows, host = [], []
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if device_us:
            rows.append({"name": event.key[:90], "calls": event.count, "device_ms": device_us / 1000.0})
        if event.self_cpu_time_total and args.phase == "mixed":
            host_ms = event.self_cpu_time_total / 1e3
            host.append({"name": event.key[:90], "calls": event.count, "host_ms": host_ms})
    rows.sort(key=lambda r: -r["device_ms"])
    host.sort(key=lambda r: -r["host_ms"])
    return {
        "phase": args.phase,
        "steps": steps,
        "per_step_ms": {r["name"]: r["device_ms"] / max(steps, 1) for r in rows[:25]},
        "top": rows[:25],
        "host_top": host[:25],
        "step_records": [  # (tokens, prefill tokens, rows, device ms, host launch ms)
            (r.num_tokens, r.num_prefill_tokens, r.batch_size, round(r.compute_ms, 3), round(r.launch_ms, 3))
            for r in records
        ],
    }


async def one_prompt_step(engine: Engine, one, i: int) -> asyncio.Task:
    """Start request i and let the engine take a few steps, so its prompt lands in a mixed step."""
    task = asyncio.create_task(one(i))
    steps = engine.stats().steps
    while engine.stats().steps < steps + 3:
        await asyncio.sleep(0.0005)
    return task


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--random-weights", action="store_true")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=400)
    p.add_argument("--settle-s", type=float, default=1.0)
    p.add_argument("--window-s", type=float, default=0.3)
    p.add_argument("--phase", choices=("decode", "prefill", "mixed"), default="decode")
    p.add_argument("--max-batched-tokens", type=int, default=512, help="the engine's step token budget")
    add_decode_flags(p)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    result = asyncio.run(_profile(args))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(f"steps profiled: {result['steps']}")
    for row in result["top"][:18]:
        per_step = row["device_ms"] / max(result["steps"], 1)
        print(f"{per_step:8.3f} ms/step  {row['calls']:6d}  {row['name']}")
    for row in result["host_top"][:18]:
        per_step = row["host_ms"] / max(result["steps"], 1)
        print(f"host {per_step:8.3f} ms/step  {row['calls']:6d}  {row['name']}")
    for record in result["step_records"][:12]:
        print("step (tokens, prefill, rows, device ms, launch ms):", record)


if __name__ == "__main__":
    main()
