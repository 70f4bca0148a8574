"""Sampling on the GPU (skipped without CUDA): the kernels against the torch reference, the
distribution, graphed steps equal eager and sync ones for any mix of sampling options, seeds under
any batch, logprobs against transformers, and no host syncs in sampled steps.

Run on the GPU machine: python -m pytest tests/gpu -q --confcutdir=tests/gpu
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from replica import Engine, EngineConfig, SamplingParams
from replica.penalty_state import apply_penalties
from replica.sampler import SamplingTensors, sample_reference
from replica.triton_penalties import penalized_logits
from replica.triton_sampler import sample_rows

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
VOCAB = 49152


def _random_params(rows: int, g: torch.Generator) -> SamplingTensors:
    return SamplingTensors(
        temperature=torch.where(
            torch.rand(rows, generator=g) < 0.2, 0.0, torch.rand(rows, generator=g) + 0.2
        ),
        top_k=torch.randint(0, 100, (rows,), generator=g) * (torch.rand(rows, generator=g) < 0.4),
        top_p=torch.where(
            torch.rand(rows, generator=g) < 0.6, torch.rand(rows, generator=g) * 0.5 + 0.5, 1.0
        ),
        min_p=torch.where(torch.rand(rows, generator=g) < 0.3, torch.rand(rows, generator=g) * 0.2, 0.0),
        seed=torch.randint(0, 2**32, (rows,), generator=g),
        position=torch.randint(0, 5000, (rows,), generator=g),
    )


def _cuda(params: SamplingTensors) -> SamplingTensors:
    return SamplingTensors(**{k: v.cuda() for k, v in vars(params).items()})


def test_sampler_kernel_equals_the_torch_reference():
    g = torch.Generator().manual_seed(1)
    rows = 256
    logits = torch.randn(rows, VOCAB, generator=g) * torch.rand(rows, 1, generator=g) * 8
    params = _random_params(rows, g)
    reference = sample_reference(logits, params)
    kernel = sample_rows(logits.cuda(), _cuda(params)).cpu()
    assert torch.equal(kernel, reference), (kernel != reference).nonzero()


def test_kernel_draws_follow_the_distribution():
    logits = torch.tensor([2.0, 1.5, 1.2, 0.7, 0.3, 0.0, -0.4, -1.0], device="cuda")
    n = 100000
    params = SamplingTensors(
        temperature=torch.full((n,), 0.9, device="cuda"), top_k=torch.full((n,), 6, device="cuda"),
        top_p=torch.full((n,), 0.9, device="cuda"), min_p=torch.full((n,), 0.05, device="cuda"),
        seed=torch.full((n,), 3, device="cuda"), position=torch.arange(n, device="cuda"),
    )  # fmt: skip
    ids = sample_rows(logits.expand(n, -1).contiguous(), params)
    freq = torch.bincount(ids, minlength=8).double().cpu() / n
    p = torch.softmax(logits.double().cpu() / 0.9, dim=-1)
    greater = p[None, :] > p[:, None]
    keep = (greater.sum(1) < 6) & ((greater * p[None, :]).sum(1) < 0.9) & (p >= 0.05 * p.max())
    target = torch.where(keep, p, 0.0) / torch.where(keep, p, 0.0).sum()
    assert (freq[~keep] == 0).all()
    assert torch.allclose(freq, target, atol=0.006), (freq, target)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_penalty_kernel_matches_the_reference(dtype):
    g = torch.Generator().manual_seed(2)
    raw = (torch.randn(6, VOCAB, generator=g) * 4).to(dtype)
    counts = torch.randint(0, 4, (8, VOCAB), generator=g, dtype=torch.int32) * (
        torch.rand(8, VOCAB, generator=g) < 0.01
    )
    prompt = (torch.rand(8, VOCAB, generator=g) < 0.01).to(torch.uint8)
    slots = torch.tensor([0, -1, 5, 7, 2, -1])
    pen = [
        torch.tensor(v) for v in ([1.3, 1, 0.8, 1.1, 1, 1], [0.4, 0, 0, 0.2, -0.5, 0], [0.6, 0, 1, 0, 0.1, 0])
    ]
    ref = apply_penalties(raw.float(), slots, *pen, counts, prompt.bool())
    got = penalized_logits(raw.cuda(), slots.cuda(), *(t.cuda() for t in pen), counts.cuda(), prompt.cuda())
    assert torch.allclose(got.cpu(), ref, rtol=1e-6, atol=1e-6)


def _prompts(count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(100, VOCAB - 100, size=int(n)).tolist() for n in rng.integers(8, 200, size=count)]


def _mixed_params(i: int) -> SamplingParams:
    """A sampling mix like real traffic: most rows tempered with filters, some penalties and bias,
    logprobs, n > 1 and a greedy minority."""
    kinds = [
        dict(temperature=0.8, top_p=0.9),
        dict(temperature=1.0, top_k=50),
        dict(temperature=0.7, min_p=0.05, repetition_penalty=1.1),
        dict(temperature=0.0),
        dict(temperature=0.9, top_p=0.95, frequency_penalty=0.5, presence_penalty=0.3),
        dict(temperature=0.6, logit_bias={123: 5.0, 456: -100.0}, min_tokens=4),
        dict(temperature=1.0, logprobs=5),
        dict(temperature=0.8, n=2),
    ]
    return SamplingParams(
        max_tokens=24 + (i * 7) % 20, seed=1000 + i, ignore_eos=True, **kinds[i % len(kinds)]
    )


async def _run(config: EngineConfig, prompts, params, together: bool = True, sync_debug: bool = False):
    engine = Engine(config)
    await engine.start()
    try:
        warm = SamplingParams(max_tokens=4, temperature=0.9, top_p=0.9, seed=1)
        [o async for o in engine.generate(prompts[0], warm)]
        if sync_debug:
            torch.cuda.set_sync_debug_mode("error")

        async def one(i: int):
            outs = [o async for o in engine.generate(prompts[i], params[i])]
            return [(o.index, t) for o in outs for t in o.token_ids]

        if together:
            engine.hold()
        tasks = [asyncio.create_task(one(i)) for i in range(len(prompts))]
        if together:
            while engine.open_streams < len(prompts):
                await asyncio.sleep(0)
            engine.release()
        outputs = await asyncio.gather(*tasks)
        runner = engine.core.runner
        if sync_debug:
            torch.cuda.set_sync_debug_mode(0)
        replays = {k: g.replays for k, g in runner.graphs.items()}
        replays.update({f"mixed-{k}": g.replays for k, g in runner.mixed.fresh.items()})
        return outputs, replays, engine.stats()
    finally:
        if sync_debug:
            torch.cuda.set_sync_debug_mode(0)
        await engine.stop()


def test_sampled_mix_graphed_equals_eager_and_sync():
    prompts = _prompts(16, seed=4)
    params = [_mixed_params(i) for i in range(16)]
    base = dict(model="smollm2-135m", random_weights=True, device="cuda", max_num_seqs=32, dtype="float32")
    runs = {
        "async": EngineConfig(**base, mode="async"),
        "sync": EngineConfig(**base, mode="sync"),
        "eager": EngineConfig(**base, mode="async", cuda_graphs=False),
    }
    results = {name: asyncio.run(_run(cfg, prompts, params)) for name, cfg in runs.items()}
    for name in ("async", "eager"):
        differ = [
            (i, params[i], _first_difference(a, b))
            for i, (a, b) in enumerate(zip(results[name][0], results["sync"][0], strict=True))
            if a != b
        ]
        assert not differ, f"{name} differs from sync: {differ}"
    replays = results["async"][1]
    assert replays["sample"] > 0, replays  # float32: no flash, no mixed graphs (see the test below)
    assert all(r[2].kv_blocks_used == 0 for r in results.values())


def _first_difference(a: list, b: list) -> tuple[int, object, object]:
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return at, a[at : at + 3], b[at : at + 3]


def test_seeded_request_alone_equals_it_in_a_crowd():
    prompts = _prompts(12, seed=6)
    params = [_mixed_params(i) for i in range(12)]
    cfg = EngineConfig(
        model="smollm2-135m", random_weights=True, device="cuda", max_num_seqs=32, dtype="float32"
    )
    crowd, _, _ = asyncio.run(_run(cfg, prompts, params, together=False))
    for i in (0, 2, 4, 7):
        alone, _, _ = asyncio.run(_run(cfg, [prompts[i]], [params[i]]))
        assert alone[0] == crowd[i], i


def test_sampled_steps_never_sync_with_the_host():
    prompts = _prompts(8, seed=8)
    params = [_mixed_params(i) for i in range(8)]
    cfg = EngineConfig(model="smollm2-135m", random_weights=True, device="cuda", max_num_seqs=16)
    outputs, replays, _ = asyncio.run(_run(cfg, prompts[: len(params)], params, sync_debug=True))
    assert all(outputs) and replays["sample"] > 0


def test_logprob_kernel_equals_log_softmax_and_skips_rows_that_did_not_ask():
    from replica.triton_logprobs import logprob_rows

    g = torch.Generator().manual_seed(3)
    for vocab, dtype in ((49152, torch.float32), (128256, torch.bfloat16)):
        rows = 64
        raw = (torch.randn(rows, vocab, generator=g) * 6).to(dtype).cuda()
        tokens = torch.randint(0, vocab, (rows,), generator=g).cuda()
        asks = torch.rand(rows, generator=g) < 0.3
        want = torch.where(asks, torch.randint(0, 21, (rows,), generator=g), -1)
        out = {"logprob": torch.full((rows,), 7.0), "top_logprobs": torch.full((rows, 20), 7.0),
               "top_ids": torch.full((rows, 20), -7, dtype=torch.int64)}  # fmt: skip
        out = {k: v.cuda() for k, v in out.items()}
        logprob_rows(raw, tokens, want.to(torch.int32).cuda(), out)
        ref = torch.log_softmax(raw.float(), dim=-1)
        asked = want >= 0
        got = {k: v.cpu() for k, v in out.items()}
        assert (got["logprob"][~asked] == 7.0).all() and (got["top_ids"][~asked] == -7).all()
        rows_asked = asked.nonzero()[:, 0].cuda()
        chosen = ref[rows_asked, tokens[rows_asked]].cpu()
        assert torch.allclose(got["logprob"][asked], chosen, atol=1e-3)
        top = ref[rows_asked].topk(20, dim=-1).values.cpu()
        assert torch.allclose(got["top_logprobs"][asked], top, atol=1e-3)
        at_ids = ref[rows_asked].gather(1, got["top_ids"][asked].cuda()).cpu()
        assert torch.allclose(at_ids, top, atol=1e-3)  # the ids hold those values (bf16 ties: any order)


@pytest.mark.parametrize("graphs", [True, False], ids=["graphed", "eager"])
def test_logprobs_equal_transformers_in_float32(graphs: bool):
    """Rows that ask beside rows that do not, in one batch, graphed and eager: each asking row's
    logprobs are the float32 log-softmax of transformers' logits."""
    from bench.hf_reference import hf_model_like
    from replica.model_loader import load_model

    prompts = _prompts(3, seed=10)
    cfg = EngineConfig(
        model="smollm2-135m", random_weights=True, device="cuda", dtype="float32", cuda_graphs=graphs
    )
    asks = [SamplingParams(max_tokens=6, temperature=t, logprobs=k, seed=5, ignore_eos=True)
            for t, k in ((0.0, 5), (0.9, 20), (1.0, 0))]  # fmt: skip
    got = asyncio.run(_logprob_run(cfg, prompts, asks))
    hf = hf_model_like(load_model("smollm2-135m", torch.device("cuda"), torch.float32, True, 0))
    for prompt, q, lps in zip(prompts, asks, got, strict=True):
        ids = torch.tensor([prompt + [lp.token_id for lp in lps]], device="cuda")
        with torch.no_grad():
            ref = torch.log_softmax(hf(ids).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
        for step, lp in enumerate(lps):
            assert abs(lp.logprob - ref[step, lp.token_id].item()) < 1e-3
            assert [t for t, _ in lp.top] == ref[step].topk(q.logprobs).indices.tolist()


async def _logprob_run(cfg: EngineConfig, prompts, asks) -> list[list]:
    """The asking requests together with three that do not ask, arriving as one batch."""
    engine = Engine(cfg)
    await engine.start()
    try:
        quiet = SamplingParams(max_tokens=6, temperature=0.8, seed=9, ignore_eos=True)

        async def one(p, q):
            return [lp for o in [o async for o in engine.generate(p, q)] for lp in o.logprobs or []]

        engine.hold()
        tasks = [asyncio.create_task(one(p, q)) for p, q in zip(prompts, asks, strict=True)]
        tasks += [asyncio.create_task(one(p, quiet)) for p in prompts]
        while engine.open_streams < len(tasks):
            await asyncio.sleep(0)
        engine.release()
        return (await asyncio.gather(*tasks))[: len(asks)]
    finally:
        await engine.stop()


def test_a_mixed_step_with_logprob_rows_replays_a_graph():
    """Prompts arriving while logprob rows decode join them in mixed steps; each such step replays a
    mixed graph (before, any logprob row sent the whole step to eager launches)."""
    prompts = _prompts(12, seed=12)
    cfg = EngineConfig(model="smollm2-135m", random_weights=True, device="cuda", max_num_seqs=32)

    async def run():
        engine = Engine(cfg)
        await engine.start()
        try:
            long = SamplingParams(max_tokens=64, temperature=1.0, logprobs=5, seed=1, ignore_eos=True)
            first = [o async for o in engine.generate(prompts[0], SamplingParams(max_tokens=2))]
            assert first
            engine.core.profiler.records.clear()
            streams = [asyncio.create_task(_drain(engine, p, long)) for p in prompts[:4]]
            for p in prompts[4:]:  # one new prompt at a time, while the logprob rows decode
                await _drain(engine, p, SamplingParams(max_tokens=2, temperature=0.7, seed=2))
            await asyncio.gather(*streams)
            return list(engine.core.profiler.records)
        finally:
            await engine.stop()

    records = asyncio.run(run())
    mixed = [r for r in records if r.kind == "logprobs" and r.num_prefill_tokens and r.batch_size > 1]
    assert mixed, "no mixed step carried a logprob row"
    assert all(r.graphed for r in mixed), [(r.batch_size, r.num_tokens) for r in mixed if not r.graphed]


async def _drain(engine: Engine, prompt, params) -> int:
    return sum([len(o.token_ids) async for o in engine.generate(prompt, params)])
