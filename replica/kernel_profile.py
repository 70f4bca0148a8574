"""Where a steady decode step's device time goes: top kernels from torch.profiler (CUDA only).

python -m replica.kernel_profile --model llama-3.1-8b --random-weights --batch 32 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from torch.profiler import ProfilerActivity, profile

from replica.bench import make_prompts
from replica.config import EngineConfig
from replica.engine import Engine
from replica.sampling_params import SamplingParams


async def _profile(args) -> dict:
    engine = Engine(EngineConfig(model=args.model, random_weights=args.random_weights, device="cuda"))
    await engine.start()
    prompts = make_prompts(engine.loaded.config.vocab_size, args.batch, args.prompt_len)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)

    async def one(i: int) -> None:
        async for _ in engine.generate(prompts[i], params):
            pass

    if args.phase == "prefill":  # prompts only (one token each): the profile holds prefill steps
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        await asyncio.gather(*(one(i) for i in range(args.batch)))  # warm-up: same shapes
        steps_before = engine.stats().steps
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            await asyncio.gather(*(one(i) for i in range(args.batch)))
        steps = engine.stats().steps - steps_before
    else:
        tasks = [asyncio.create_task(one(i)) for i in range(args.batch)]
        await asyncio.sleep(args.settle_s)  # past the prefills: steady decode
        steps_before = engine.stats().steps
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            await asyncio.sleep(args.window_s)
        steps = engine.stats().steps - steps_before
        await asyncio.gather(*tasks)
    await engine.stop()
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if device_us:
            rows.append({"name": event.key[:90], "calls": event.count, "device_ms": device_us / 1000.0})
    rows.sort(key=lambda r: -r["device_ms"])
    return {
        "phase": args.phase,
        "steps": steps,
        "per_step_ms": {r["name"]: r["device_ms"] / max(steps, 1) for r in rows[:25]},
        "top": rows[:25],
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--random-weights", action="store_true")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=400)
    p.add_argument("--settle-s", type=float, default=1.0)
    p.add_argument("--window-s", type=float, default=0.3)
    p.add_argument("--phase", choices=("decode", "prefill"), default="decode")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    result = asyncio.run(_profile(args))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(f"steps profiled: {result['steps']}")
    for row in result["top"][:18]:
        per_step = row["device_ms"] / max(result["steps"], 1)
        print(f"{per_step:8.3f} ms/step  {row['calls']:6d}  {row['name']}")


if __name__ == "__main__":
    main()
