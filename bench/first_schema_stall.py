"""What a replica's first response format costs the streams it already serves (issue 42).

The grammar library's view of the tokenizer (every id's bytes) is built once per engine; its
constructor holds the interpreter lock for about a second at 128k ids. Built for the first request
that asks for a JSON schema, it stalls the engine loop and so every stream. CUDA engines now build
it at start (`Engine.prepare_grammars`). This measures the stall on the CPU: a greedy stream runs,
then a JSON-schema request arrives, and the stream's longest gap between tokens after that arrival
is set beside its gaps before it; once with the view built lazily (as before), once prepared first.
Each in a fresh process, in turns.

    python -m bench.first_schema_stall --json docs/bench/cpu_first_schema_stall.json

SmolLM2 with its own tokenizer (49,152 ids; the view takes longer at Llama 3's 128,256).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 40}, "score": {"type": "integer"}},
    "required": ["answer", "score"],
    "additionalProperties": False,
}
STREAM_TOKENS = 160
SCHEMA_AFTER = 40  # the stream's tokens before the schema request is sent


async def one_run(prepared: bool) -> dict:
    from replica import Engine, EngineConfig, SamplingParams
    from replica.grammar_spec import json_schema

    engine = Engine(EngineConfig(model="smollm2-135m", device="cpu", mode="async"))
    await engine.start()
    if prepared:
        t0 = time.perf_counter()
        assert await engine.prepare_grammars()
        prepare_s = time.perf_counter() - t0
    else:
        prepare_s = 0.0
    stamps: list[float] = []
    sent_at: list[float] = []

    async def schema_request() -> None:
        sent_at.append(time.perf_counter())
        params = SamplingParams(max_tokens=40, temperature=0.0, grammar=json_schema(SCHEMA))
        async for _ in engine.generate([1, 2, 3, 4, 5, 6, 7, 8], params):
            pass

    task = None
    params = SamplingParams(max_tokens=STREAM_TOKENS, temperature=0.0, ignore_eos=True)
    async for out in engine.generate(list(range(10, 60)), params):
        stamps.extend([time.perf_counter()] * len(out.token_ids))
        if len(stamps) >= SCHEMA_AFTER and task is None:
            task = asyncio.create_task(schema_request())
    await task
    await engine.stop()
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]
    split = next(i for i, s in enumerate(stamps) if s >= sent_at[0])
    before, after = gaps[: split - 1], gaps[split - 1 :]
    return {
        "prepared": prepared,
        "prepare_s": prepare_s,
        "gap_ms_before_median": statistics.median(before),
        "gap_ms_before_max": max(before),
        "gap_ms_after_max": max(after),
        "stall_ms": max(after) - statistics.median(before),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--runs", type=int, default=3, help="runs of each, in turns, each in a fresh process")
    p.add_argument("--one", choices=("lazy", "prepared"), default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:  # a child: one run, its figures on stdout's last line
        print(json.dumps(asyncio.run(one_run(args.one == "prepared"))))
        return {}
    runs: dict[str, list[dict]] = {"lazy": [], "prepared": []}
    for _ in range(args.runs):
        for name in runs:
            cmd = [sys.executable, "-m", "bench.first_schema_stall", "--one", name]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
            print(name, runs[name][-1], flush=True)
    rep = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": platform.node(),
        "processor": platform.processor() or platform.machine(),
        "args": {"runs": args.runs},
        "runs": runs,
        "median_stall_ms": {k: statistics.median(r["stall_ms"] for r in v) for k, v in runs.items()},
    }
    print(json.dumps(rep["median_stall_ms"]))
    if args.json:
        args.json.write_text(json.dumps(rep, indent=2))
    return rep


if __name__ == "__main__":
    main()
