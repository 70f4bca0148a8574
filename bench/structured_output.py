"""Structured output's cost in throughput: one trace with a JSON schema on every request, then the
same trace without, on one engine (8B shape, random weights, on the H200).

    python -m bench.structured_output --model llama-3.1-8b --random-weights --device cuda \\
        --requests 256 --rates inf,20 --json out/structured_output.json

The trace is bench/engine_trace.py's (Poisson arrivals, lognormal prompts, fixed by --seed) with
sampled requests (--sampling mix: the load generator's mix, 80% tempered; `sampled`: temperature 1,
top-p 0.95). The constrained run goes first: each request's answer ends where the grammar ends (its
EOS), so the schema's answers are bounded (strings with maxLength, fixed properties, a short array)
and --max-tokens only guards. The unconstrained run then asks each request for exactly the tokens
its constrained twin produced, with EOS ignored, so both runs do the same work and their output
tok/s compare; the report gives both and the ratio (target ≥ 0.9), the host time per filled mask
row, and how many constrained answers ended by their grammar.

Random-weight presets ship no tokenizer, and a grammar needs every id's bytes: the engine gets
bench/bpe_vocab.py's byte-level BPE at the model's vocabulary size (128,256 for the 8B shape, so the
mask costs what a Llama 3 vocabulary's would; trained on the standard library on first use, about
ten seconds, then cached). The cluster's generated word tokenizer (cluster/text/word_tokenizer.py)
cannot serve: llguidance reads token bytes from byte-level, byte-fallback and similar decoders, and
its WordPiece-style decoder is none of them (a response format there is refused with a 400).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import time

import numpy as np
import torch

from bench.bpe_vocab import attach
from bench.engine_trace import add_engine_args, add_trace_shape_args, make_trace, summarise
from replica.config import EngineConfig
from replica.engine import Engine
from replica.grammar_spec import json_schema
from replica.sampling_params import SamplingParams

# Bounded answers: five properties, strings of at most 16 characters, a short array.
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 100000},
        "title": {"type": "string", "maxLength": 16},
        "status": {"enum": ["open", "closed", "pending"]},
        "urgent": {"type": "boolean"},
        "labels": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["id", "title", "status", "urgent", "labels"],
    "additionalProperties": False,
}


def sampling(args, i: int, mixed: dict) -> dict:
    if args.sampling == "mix":
        return mixed
    return {"temperature": 1.0, "top_p": 0.95, "seed": 1000 + i}


async def run_once(engine: Engine, trace, args, lengths: list[int] | None, spec) -> tuple[dict, list, list]:
    """lengths None: the constrained run (grammar on, EOS ends it); else the plain run of those lengths."""
    engine.core.profiler.records.clear()
    start = time.perf_counter()

    async def one(i: int, req) -> dict:
        await asyncio.sleep(max(0.0, start + req.arrival_s - time.perf_counter()))
        fields = sampling(args, i, req.mixed)
        if lengths is None:
            params = SamplingParams(max_tokens=args.max_tokens, grammar=spec, **fields)
        else:
            params = SamplingParams(max_tokens=max(lengths[i], 1), ignore_eos=True, **fields)
        sent = time.perf_counter()
        stamps: list[float] = []
        reason = None
        async for out in engine.generate(req.prompt, params, request_id=f"so-{i}-{sent}"):
            stamps.extend([time.perf_counter()] * len(out.token_ids))
            reason = out.finish_reason or reason
        return {"sent": sent, "stamps": stamps, "reason": reason}

    done = await asyncio.gather(*(one(i, r) for i, r in enumerate(trace)))
    wall = max(d["stamps"][-1] for d in done) - start
    return summarise(done, wall, engine.profile_summary()), [len(d["stamps"]) for d in done], done


async def run(args) -> dict:
    engine = Engine(
        EngineConfig(
            model=args.model, device=args.device, random_weights=args.random_weights,
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens,
            enable_prefix_caching=args.prefix_caching,  # off: the plain run repeats the prompts
            context_cuda_graphs=args.context_graphs,
        )
    )  # fmt: skip
    await engine.start()
    t0 = time.perf_counter()
    attach(engine)
    tokenizer_s = time.perf_counter() - t0
    spec = json_schema(SCHEMA)
    vocab = engine.loaded.config.vocab_size
    results: dict = {"tokenizer_s": tokenizer_s}
    try:
        warm = make_trace(args, vocab, math.inf)[:8]
        await run_once(engine, warm, args, None, spec)  # compiles the grammar, warms both paths
        await run_once(engine, warm, args, [16] * len(warm), spec)
        for rate_name in args.rates.split(","):
            rate = math.inf if rate_name == "inf" else float(rate_name)
            trace = make_trace(args, vocab, rate)
            grammars = engine.grammars
            rows0, fill0, adv0 = grammars.rows_filled, grammars.fill_seconds, grammars.advance_seconds
            constrained, lengths, done = await run_once(engine, trace, args, None, spec)
            rows, fill = grammars.rows_filled - rows0, grammars.fill_seconds - fill0
            constrained["grammar_ended"] = sum(d["reason"] == "stop" for d in done)
            constrained["mask_fill_us_per_row"] = fill / max(rows, 1) * 1e6
            constrained["mask_rows_filled"] = rows
            steps = constrained["steps"] or 1
            constrained["mask_fill_ms_per_step"] = fill * 1e3 / steps
            constrained["advance_ms_per_step"] = (grammars.advance_seconds - adv0) * 1e3 / steps
            constrained["output_len_mean"] = float(np.mean(lengths))
            plain, _, _ = await run_once(engine, trace, args, lengths, spec)
            ratio = constrained["output_tokens_per_s"] / plain["output_tokens_per_s"]
            results[rate_name] = {"json_schema": constrained, "plain": plain, "ratio": ratio}
            print(
                f"[structured] @{rate_name}: json_schema {constrained['output_tokens_per_s']:.0f} tok/s, "
                f"plain {plain['output_tokens_per_s']:.0f} tok/s, ratio {ratio:.3f} "
                f"({constrained['grammar_ended']}/{len(trace)} ended by the grammar, "
                f"{constrained['mask_fill_us_per_row']:.1f} µs per mask row)",
                flush=True,
            )
            if args.json:
                args.json.write_text(json.dumps(report(args, results, spec), indent=2, default=str))
    finally:
        await engine.stop()
    return report(args, results, spec)


def report(args, results: dict, spec) -> dict:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": platform.node(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "args": vars(args),
        "schema": json.loads(spec.schema),
        "results": results,
    }


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p, "llama-3.1-8b")
    add_trace_shape_args(p)  # output lengths are drawn too, unused: the grammar decides
    p.add_argument("--sampling", choices=("mix", "sampled"), default="mix")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--rates", default="inf,20", help="requests per second; inf = all at once")
    p.add_argument("--max-tokens", type=int, default=512, help="a guard: answers end with their grammar")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    rep = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(rep, indent=2, default=str))
    return rep


if __name__ == "__main__":
    main()
