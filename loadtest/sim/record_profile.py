"""Record raw per-step engine profiles on this machine and fit the simulator's step-time model.

    python -m loadtest.sim.record_profile --device cpu --out loadtest/sim/data/step_cpu-smollm2.json
    python -m loadtest.sim.record_profile --from-jsonl runs/fid-cluster/steps.jsonl --out model.json

Drives the real ``replica.Engine`` (random-weight SmolLM2-135M shape by default) through a mix of
batch sizes, prompt lengths and staggered arrivals, so prefill and decode steps of many batch sizes
and context lengths are profiled; then fits ``step_ms = a + b·batch + c·prefill_tokens + d·Σcontext``
by least squares (``loadtest.sim.step_model.fit``) on each step's host-side busy time (see
``samples_from_records``). Writes the coefficients with their provenance.
``--from-jsonl`` fits records taken elsewhere (a running cluster: ``loadtest.sim.cluster_profile``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from pathlib import Path

import numpy as np

from loadtest.sim.step_model import StepSample, fit

MIXES = ((1, 64, 48), (2, 128, 48), (4, 64, 64), (8, 256, 32), (12, 32, 48), (16, 128, 32))


async def _run_mix(engine, vocab: int, concurrency: int, prompt_len: int, max_tokens: int, seed: int) -> None:
    from replica.sampling_params import SamplingParams

    rng = np.random.default_rng(seed)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)

    async def one(i: int) -> None:
        await asyncio.sleep(0.05 * i * rng.random())  # staggered joins: mixed prefill + decode steps
        prompt = rng.integers(100, vocab - 100, size=int(prompt_len * (0.5 + rng.random()))).tolist()
        async for _ in engine.generate(prompt, params, request_id=f"prof-{seed}-{i}"):
            pass

    await asyncio.gather(*(one(i) for i in range(concurrency)))


def samples_from_records(records: list[dict]) -> list[StepSample]:
    """Step samples from raw ``StepRecord``s (dicts) of one engine.

    A step's duration is its host-side work: prepare + H2D + compute + D2H + postprocess. On the
    CPU these stages run one after another on the same cores, so they add up. The *period* between
    successive steps' deliveries is not usable: ``idle_ms`` stays ~0 even when the loop slept for
    seconds waiting for work (measured in the cluster run: prefill-after-idle periods of 1-3 s with
    ``idle_ms`` < 1), and in the async loop a step's period carries the previous step's work.
    """
    return [
        StepSample(r["batch_size"], r["num_prefill_tokens"], r["context_tokens"], busy_ms(r))
        for r in records
        if r["batch_size"] > 0
    ]


def busy_ms(r: dict) -> float:
    """A step's host-side work, ms (the stages run one after another on the CPU)."""
    stages = ("prepare_ms", "h2d_ms", "compute_ms", "d2h_ms", "postprocess_ms")
    return r.get("schedule_ms", 0.0) + sum(r[name] for name in stages)


async def record(args) -> list[dict]:
    from replica.config import EngineConfig
    from replica.engine import Engine

    config = EngineConfig(
        model=args.model,
        device=args.device,
        random_weights=True,
        max_num_seqs=32,
        max_num_batched_tokens=args.max_batched_tokens,
        profile_history=8192,
    )
    engine = Engine(config)
    await engine.start()
    vocab = engine.loaded.config.vocab_size
    records: list[dict] = []
    for seed, (conc, plen, mtok) in enumerate(MIXES):
        engine.core.profiler.records.clear()
        await _run_mix(engine, vocab, conc, plen, mtok, seed)
        records.extend(engine.core.profiler.recent(8192))
    await engine.stop()
    return records


def read_jsonl(path: Path) -> list[dict]:
    """Raw step records written by ``--raw`` or ``loadtest.sim.cluster_profile`` (one per line)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def samples_by_engine(records: list[dict]) -> list[StepSample]:
    """Samples of each engine's records separately (a cluster file holds several replicas')."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r.get("replica", ""), []).append(r)
    return [s for group in groups.values() for s in samples_from_records(group)]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-batched-tokens", type=int, default=512)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--raw", type=Path, default=None, help="also write the raw step records (JSONL)")
    p.add_argument(
        "--from-jsonl", type=Path, default=None, help="fit these raw records instead of driving an engine"
    )
    p.add_argument("--name", default=None, help="the model's name (default DEVICE-MODEL)")
    args = p.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    records = read_jsonl(args.from_jsonl) if args.from_jsonl else asyncio.run(record(args))
    model, stats = fit(samples_by_engine(records))
    source = (
        f"raw StepRecords of {args.from_jsonl} (loadtest/sim/cluster_profile.py during a load test)"
        if args.from_jsonl
        else "loadtest/sim/record_profile.py: replica.Engine step profiler, raw records"
    )
    result = {
        "name": args.name or f"{args.device}-{args.model}",
        **model.as_dict(),
        "provenance": {
            "source": source,
            "date": started,
            "machine": platform.platform(),
            "processor": platform.processor(),
            "model": args.model,
            "device": args.device,
            "mixes": None if args.from_jsonl else MIXES,
            "max_num_batched_tokens": args.max_batched_tokens,
            **stats,
        },
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    if args.raw is not None:
        args.raw.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
