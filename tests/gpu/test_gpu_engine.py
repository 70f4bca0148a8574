"""GPU checks (skipped without CUDA): the Triton kernel, graphs, both IO sets, stream order, no syncs.

Run on the GPU machine: python -m pytest tests/gpu -q --confcutdir=tests/gpu
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from replica import Engine, EngineConfig, SamplingParams
from replica.attention import decode_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _prompts(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(100, vocab - 100, size=int(n)).tolist() for n in rng.integers(8, 300, size=count)]


async def _generate_all(config: EngineConfig, prompts, max_tokens: list[int], sync_debug: bool = False):
    engine = Engine(config)
    await engine.start()
    try:
        warm = [t async for t in engine.generate(prompts[0], SamplingParams(max_tokens=4, temperature=0))]
        assert warm
        if sync_debug:
            torch.cuda.set_sync_debug_mode("error")  # any implicit host-device sync now raises

        async def one(i: int) -> list[int]:
            await asyncio.sleep(0.002 * (i % 5))
            params = SamplingParams(max_tokens=max_tokens[i], temperature=0, ignore_eos=True)
            return [
                t for out in [o async for o in engine.generate(prompts[i], params)] for t in out.token_ids
            ]

        outputs = await asyncio.gather(*(one(i) for i in range(len(prompts))))
        graphed = engine.core.runner.graphs is not None
        stats = engine.stats()
        return outputs, graphed, stats, engine.profile_summary()
    finally:
        torch.cuda.set_sync_debug_mode(0)
        await engine.stop()


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (32, 8, 128), (32, 8, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_decode_matches_reference(heads, kv_heads, dim, dtype):
    from replica.triton_decode import paged_decode_attention

    torch.manual_seed(heads + dim)
    batch, blocks, block_size = 7, 256, 16
    k_cache = torch.randn(blocks, block_size, kv_heads, dim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    lens = torch.tensor([1, 15, 16, 17, 300, 777, 64], device="cuda")
    width = 64
    tables = torch.stack([torch.randperm(blocks - 1, device="cuda")[:width] + 1 for _ in range(batch)])
    q = torch.randn(batch, heads, dim, device="cuda", dtype=dtype)
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens, dim**-0.5)
    ref = decode_attention(q.double(), k_cache.double(), v_cache.double(), tables, lens, dim**-0.5)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < (1e-2 if dtype == torch.bfloat16 else 1e-5), err


def test_async_sync_and_eager_agree_and_graphs_are_used():
    prompts = _prompts(12, 49152)
    max_tokens = [40, 8, 64, 33, 17, 50, 3, 29, 64, 12, 45, 20]
    base = dict(model="smollm2-135m", random_weights=True, device="cuda", max_num_seqs=32)
    runs = {
        "async": EngineConfig(**base, mode="async"),
        "sync": EngineConfig(**base, mode="sync"),
        "async-eager": EngineConfig(**base, mode="async", cuda_graphs=False),
        "async-small-kv": EngineConfig(**base, mode="async", num_kv_blocks=120, max_num_batched_tokens=256),
    }
    results = {name: asyncio.run(_generate_all(cfg, prompts, max_tokens)) for name, cfg in runs.items()}
    reference = results["sync"][0]
    for name, (outputs, *_rest) in results.items():
        assert outputs == reference, f"{name} differs from sync"
        assert [len(o) for o in outputs] == max_tokens
    assert results["async"][1] and not results["async-eager"][1]
    assert results["async-small-kv"][2].num_preemptions > 0
    assert all(r[2].kv_blocks_used == 0 for r in results.values())


def test_float32_greedy_equals_transformers():
    from replica.bench import _hf_generate
    from replica.hf_reference import hf_model_like
    from replica.model_loader import load_model

    prompts = _prompts(6, 49152, seed=3)
    cfg = EngineConfig(
        model="smollm2-135m", random_weights=True, device="cuda", dtype="float32", mode="async"
    )
    outputs, *_ = asyncio.run(_generate_all(cfg, prompts, [16] * len(prompts)))
    loaded = load_model("smollm2-135m", torch.device("cuda"), torch.float32, True, 0)
    hf = hf_model_like(loaded)
    for prompt, ours in zip(prompts, outputs, strict=True):
        assert ours == _hf_generate(hf, [prompt], 16)[0]


def test_no_hidden_syncs_in_the_step_loop():
    prompts = _prompts(8, 49152, seed=5)
    cfg = EngineConfig(
        model="smollm2-135m", random_weights=True, device="cuda", mode="async", max_num_seqs=16
    )
    outputs, graphed, _, profile = asyncio.run(_generate_all(cfg, prompts, [24] * 8, sync_debug=True))
    assert graphed and all(len(o) == 24 for o in outputs)
    assert profile["steps"] > 20
