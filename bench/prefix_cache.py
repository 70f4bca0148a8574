"""Prefix caching on against off: multi-turn conversations of many tenants, each with a long system prompt.

    python -m bench.prefix_cache --model llama-3.1-8b --random-weights --device cuda \\
        --conversations 50 --rate-fraction 0.8 --json out/prefix_cache.json

The issue's workload: --tenants (50) each with its own --system-tokens (2,000) system prompt; one
conversation per tenant (--conversations to change it: conversation c is tenant c % tenants's) of
--turns (5) turns. Each turn resends the whole history: system prompt, every earlier user message
and answer (the engine's own output tokens), then a new user message. Requests are sampled
(temperature 0.8, top-p 0.95, a seed each) with EOS ignored and answer lengths drawn up front, so
both engines do the same work. Two runs per engine:

- `saturation`: every conversation starts at once and sends its next turn as soon as it is answered;
- `poisson`: conversations start at a Poisson rate; a conversation's next turn is sent an
  exponential think time (--think-s mean) after its previous answer ended.

The poisson rate is --rate-fraction (0.8) of the capacity the *cache-off* engine's saturation run
measured: --conversations ÷ its wall time, in conversations per second (so the capacity of
--conversations conversations in flight at once); both engines are offered that same load. --rate
fixes the rate instead. So the engine with `enable_prefix_caching=False` runs first (saturation,
then poisson), then one with caching on (built after the first is stopped: the device holds one 8B
engine and its cache). Each run has its own system prompts, the same on both engines, so no run
finds another's blocks. The JSON (written after every run: a run cut off by its time limit still
reports) records the rate and how it was derived.

Per run: TTFT, TPOT and ITL at p50 and p99 (bench/engine_trace.py's `summarise`, `vllm bench
serve`'s definitions): TTFT = first token − sent; TPOT per request = (last token − first token) ÷
(output tokens − 1); ITL = every gap between consecutive token arrivals of a request, pooled over
all requests, where tokens that arrive together in one engine output are stamped with that output's
arrival time (gaps of 0 after the first). Then output tok/s, and the hit rate of cacheable prompt
tokens: a prompt's cacheable tokens are its longest common prefix with an earlier request of its
tenant (its prompt, and its answer once it has ended), in whole blocks, short of its last token:
what an unbounded cache could serve. The hit rate is the cached tokens the engine reported over
those. Targets (issue 25): TTFT p50 at the poisson rate ≥ 4× lower with caching, output tok/s at
saturation ≥ 1.5× higher, hit rate ≥ 90%.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from bench.engine_trace import add_engine_args, summarise
from replica.config import EngineConfig
from replica.engine import Engine
from replica.sampling_params import SamplingParams


@dataclass
class Conversation:
    tenant: str
    system: list[int]
    users: list[list[int]]  # one user message per turn
    answer_lens: list[int]
    think_s: list[float]
    start_s: float = 0.0
    answers: list[list[int]] = field(default_factory=list)


def make_conversations(args, vocab: int, run_seed: int, rate: float | None) -> list[Conversation]:
    """The run's conversations; `rate` None starts them all at once (saturation, no think time)."""
    rng = np.random.default_rng(args.seed * 1000 + run_seed)
    systems = [rng.integers(3, vocab, args.system_tokens).tolist() for _ in range(args.tenants)]
    convs, t = [], 0.0
    for c in range(args.conversations):
        turns = args.turns
        users = [
            rng.integers(3, vocab, max(4, int(n))).tolist() for n in _lognormal(rng, args.user_tokens, turns)
        ]
        answers = [max(1, min(args.answer_max, int(n))) for n in _lognormal(rng, args.answer_tokens, turns)]
        think = rng.exponential(args.think_s, turns).tolist() if rate else [0.0] * turns
        tenant = c % args.tenants
        convs.append(Conversation(f"tenant-{tenant}", systems[tenant], users, answers, think, start_s=t))
        if rate:
            t += float(rng.exponential(1.0 / rate))
    return convs


def _lognormal(rng: np.random.Generator, median: float, count: int) -> np.ndarray:
    return np.exp(rng.normal(np.log(median), 0.5, count))


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


RUN_SEEDS = {"saturation": 1, "poisson": 0}  # a run's system prompts: apart per run, equal per engine
LATENCY_KEYS = tuple(f"{m}_ms_p{q}" for m in ("ttft", "tpot", "itl") for q in (50, 99))


async def run_once(engine: Engine, convs: list[Conversation], block: int) -> dict:
    """Play the conversations; every request's token arrival times, cached and cacheable tokens."""
    start = time.perf_counter()
    sent_before: dict[str, list[list[int]]] = {}  # tenant -> prompts sent, prompt + answer once ended
    records: list[dict] = []

    async def conversation(ci: int, conv: Conversation) -> None:
        await asyncio.sleep(max(0.0, start + conv.start_s - time.perf_counter()))
        history = list(conv.system)
        for turn, user in enumerate(conv.users):
            prompt = history + user
            sent = time.perf_counter()
            usable = (len(prompt) - 1) // block * block
            seen = sent_before.setdefault(conv.tenant, [])
            cacheable = min(
                usable, max((_common_prefix(prompt, s) for s in seen), default=0) // block * block
            )
            mine = len(seen)
            seen.append(prompt)
            params = SamplingParams(
                max_tokens=conv.answer_lens[turn], temperature=0.8, top_p=0.95, seed=ci * 100 + turn,
                ignore_eos=True,
            )  # fmt: skip
            stamps: list[float] = []  # one per token: its output's arrival (engine_trace's rule)
            answer, cached = [], 0
            async for out in engine.generate(
                prompt, params, f"pc-{ci}-{turn}-{sent}", cache_scope=conv.tenant
            ):
                stamps.extend([time.perf_counter()] * len(out.token_ids))
                answer.extend(out.token_ids)
                cached = out.num_cached_tokens
            done = time.perf_counter()
            sent_before[conv.tenant][mine] = prompt + answer
            records.append({
                "sent": sent, "stamps": stamps, "prompt": len(prompt), "cached": cached,
                "cacheable": cacheable, "end": done,
            })  # fmt: skip
            history = prompt + answer
            await asyncio.sleep(conv.think_s[turn])

    await asyncio.gather(*(conversation(i, c) for i, c in enumerate(convs)))
    return summarise_run(records, max(r["end"] for r in records) - start, len(convs))


def summarise_run(records: list[dict], wall: float, conversations: int) -> dict:
    """One run's figures; TTFT, TPOT and ITL as bench/engine_trace.py's `summarise` computes them."""
    lat = summarise(records, wall, {})
    cacheable = sum(r["cacheable"] for r in records)
    cached = sum(r["cached"] for r in records)
    return {
        "requests": len(records),
        "wall_s": wall,
        **{k: lat[k] for k in LATENCY_KEYS},
        "output_tokens": lat["output_tokens"],
        "output_tokens_per_s": lat["output_tokens_per_s"],
        "requests_per_s": lat["requests_per_s"],
        "conversations_per_s": conversations / wall,
        "prompt_tokens": sum(r["prompt"] for r in records),
        "cacheable_prompt_tokens": cacheable,
        "cached_prompt_tokens": cached,
        "hit_rate_of_cacheable": cached / cacheable if cacheable else None,
    }


def poisson_rate(args, off_saturation: dict) -> dict:
    """The poisson run's conversation start rate: --rate, or --rate-fraction × the cache-off
    engine's capacity (conversations ÷ the wall time of its saturation run)."""
    if args.rate is not None:
        return {"conversations_per_s": args.rate, "source": "--rate"}
    capacity = args.conversations / off_saturation["wall_s"]
    return {
        "conversations_per_s": args.rate_fraction * capacity,
        "source": "--rate-fraction x the cache-off saturation run's conversations / wall_s",
        "rate_fraction": args.rate_fraction,
        "capacity_conversations_per_s": capacity,
        "capacity_requests_per_s": off_saturation["requests_per_s"],
    }


def describe(name: str, label: str, r: dict) -> str:
    return (
        f"[prefix-cache {name}] {label}: TTFT p50 {r['ttft_ms_p50']:.0f} p99 {r['ttft_ms_p99']:.0f} ms, "
        f"TPOT p50 {r['tpot_ms_p50']:.1f} p99 {r['tpot_ms_p99']:.1f} ms, "
        f"ITL p50 {r['itl_ms_p50']:.1f} p99 {r['itl_ms_p99']:.1f} ms, "
        f"{r['output_tokens_per_s']:.0f} output tok/s, {r['conversations_per_s']:.2f} conv/s, "
        f"{r['cached_prompt_tokens']}/{r['cacheable_prompt_tokens']} cacheable prompt tokens hit, "
        f"{r['wall_s']:.1f} s"
    )


async def run_engine(args, caching: bool, rep: dict) -> None:
    """Saturation then poisson on one engine, into rep["caching_on" | "caching_off"]; the cache-off
    engine's saturation run fixes rep["poisson_rate"] unless --rate did."""
    engine = Engine(
        EngineConfig(
            model=args.model, device=args.device, random_weights=args.random_weights,
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_batched_tokens,
            enable_prefix_caching=caching, context_cuda_graphs=args.context_graphs,
        )
    )  # fmt: skip
    await engine.start()
    vocab, block = engine.loaded.config.vocab_size, engine.config.block_size
    name = "on" if caching else "off"
    results: dict = rep.setdefault(f"caching_{name}", {"kv_blocks": engine.core.blocks.num_usable})
    try:
        warm = make_conversations(
            argparse.Namespace(**{**vars(args), "conversations": 4, "turns": 2}), vocab, 99, None
        )
        await run_once(engine, warm, block)  # graphs, kernels and allocator warm
        for label, run_seed in RUN_SEEDS.items():
            rate = None
            if label == "poisson":
                if "poisson_rate" not in rep:  # the cache-off engine runs first and sets it
                    rep["poisson_rate"] = poisson_rate(args, results["saturation"])
                rate = rep["poisson_rate"]["conversations_per_s"]
            convs = make_conversations(args, vocab, run_seed, rate)
            results[label] = await run_once(engine, convs, block)
            print(describe(name, label, results[label]), flush=True)
            save(args, rep)
        stats = engine.stats()
        results["kv_evictions"] = stats.kv_evictions
        results["num_preemptions"] = stats.num_preemptions
    finally:
        await engine.stop()


def summary(on: dict, off: dict) -> dict:
    ttft_ratio = off["poisson"]["ttft_ms_p50"] / on["poisson"]["ttft_ms_p50"]
    tput_ratio = on["saturation"]["output_tokens_per_s"] / off["saturation"]["output_tokens_per_s"]
    cacheable = sum(on[k]["cacheable_prompt_tokens"] for k in RUN_SEEDS)
    cached = sum(on[k]["cached_prompt_tokens"] for k in RUN_SEEDS)
    return {
        "ttft_p50_off_over_on_at_rate": ttft_ratio,
        "output_tok_s_on_over_off_at_saturation": tput_ratio,
        "hit_rate_of_cacheable": cached / cacheable if cacheable else None,
        "targets_met": {
            "ttft_p50_4x": ttft_ratio >= 4.0,
            "throughput_1_5x": tput_ratio >= 1.5,
            "hit_rate_90": bool(cacheable) and cached / cacheable >= 0.9,
        },
        # TPOT and ITL beside TTFT (DESIGN.md §7): a bursty stream has a fine TPOT and a bad ITL.
        "latency_ms": {
            f"{engine}_{label}": {k: r[label][k] for k in LATENCY_KEYS}
            for engine, r in (("on", on), ("off", off))
            for label in RUN_SEEDS
        },
    }


async def run(args) -> dict:
    rep = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": platform.node(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "args": vars(args),
    }
    await run_engine(args, caching=False, rep=rep)  # the baseline first: its capacity sets the rate
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    await run_engine(args, caching=True, rep=rep)
    rep["summary"] = summary(rep["caching_on"], rep["caching_off"])
    print(f"[prefix-cache] poisson rate {json.dumps(rep['poisson_rate'])}", flush=True)
    print(f"[prefix-cache] {json.dumps(rep['summary'])}", flush=True)
    return rep


def save(args, rep: dict) -> None:
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rep, indent=2, default=str))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p, "llama-3.1-8b", caching_flag=False)  # both engines run: no --prefix-caching
    p.add_argument("--tenants", type=int, default=50)
    p.add_argument("--conversations", type=int, default=50, help="conversation c is tenant c %% tenants's")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--system-tokens", type=int, default=2000)
    p.add_argument("--user-tokens", type=float, default=60, help="median (lognormal, sigma 0.5)")
    p.add_argument("--answer-tokens", type=float, default=128, help="median (lognormal, sigma 0.5)")
    p.add_argument("--answer-max", type=int, default=384)
    rate = p.add_mutually_exclusive_group()
    rate.add_argument(
        "--rate-fraction", type=float, default=0.8,
        help="poisson rate = this x the cache-off saturation run's conversations per second",
    )  # fmt: skip
    rate.add_argument("--rate", type=float, default=None, help="a fixed poisson rate, conversations/s")
    p.add_argument(
        "--think-s", type=float, default=1.0, help="mean pause between an answer and the next turn"
    )
    return p


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    rep = asyncio.run(run(args))
    save(args, rep)
    return rep


if __name__ == "__main__":
    main()
