"""Tensors that cost nothing until used (replica/lazy_memory.py): the CPU KV pool's zeros are mapped
on first touch, and the model is built without the default init that the loader overwrites."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

from replica.lazy_memory import lazy_zeros
from replica.model_loader import build_model
from tests.replica.checkpoints import KINDS, tiny_config

MB = 2**20
STATM = Path("/proc/self/statm")
needs_proc = pytest.mark.skipif(not STATM.exists(), reason="resident memory is read from Linux's /proc")


def _resident_bytes() -> int:
    return int(STATM.read_text().split()[1]) * 4096


def test_lazy_zeros_read_as_zeros_take_writes_and_outlive_their_mapping() -> None:
    cache = lazy_zeros((64, 16, 3, 64), torch.float32, torch.device("cpu"))
    assert cache.shape == (64, 16, 3, 64) and cache.dtype == torch.float32
    assert not cache.any()
    row = cache[7].view(-1)  # a view: the mapping must live as long as any tensor on it
    del cache
    gc.collect()
    row.fill_(2.5)
    assert float(row.sum()) == 2.5 * row.numel()
    assert lazy_zeros((0, 4), torch.bfloat16, torch.device("cpu")).shape == (0, 4)


@needs_proc
def test_a_lazy_pool_is_resident_only_where_written() -> None:
    """256 MB of zeros take (almost) no memory until written; writing a quarter makes a quarter
    resident. torch.zeros would have made all of it resident at once."""
    before = _resident_bytes()
    pool = lazy_zeros((256, MB // 4), torch.float32, torch.device("cpu"))  # 256 blocks of 1 MB
    allocated = _resident_bytes() - before
    pool[:64].fill_(1.0)
    written = _resident_bytes() - before
    assert allocated < 16 * MB, allocated / MB
    assert 60 * MB < written < 128 * MB, written / MB
    del pool


@pytest.mark.parametrize("kind", KINDS)
def test_building_a_model_draws_no_random_init(kind: str) -> None:
    """Every parameter is written by the checkpoint or init_random (replica/weights.py checks that
    none is left): the default kaiming/normal draws of nn.Linear and nn.Embedding are not made."""
    config = tiny_config(kind, 512).config
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    model = build_model(config, torch.device("cpu"), torch.float32)
    assert torch.equal(torch.rand(4), expected)  # the global generator was not advanced
    assert sum(p.numel() for p in model.parameters()) > 0


@needs_proc
def test_a_cpu_engine_holds_only_the_kv_blocks_it_has_written() -> None:
    """A 3-GB CPU pool (65,536 tokens of SmolLM2's shape in float32) starts without being written:
    the engine's memory grows by its weights and buffers, not by the pool, and still serves."""
    import asyncio

    from replica import Engine, EngineConfig, SamplingParams

    async def run() -> tuple[int, int, list[int]]:
        engine = Engine(
            EngineConfig(model="smollm2-135m", random_weights=True, device="cpu", kv_cache_tokens=65536)
        )
        before = _resident_bytes()
        await engine.start()
        try:
            pool = sum(c.numel() * c.element_size() for pair in engine.core.runner.kv_caches for c in pair)
            grown = _resident_bytes() - before
            params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
            tokens = [t async for out in engine.generate([5, 6, 7, 8], params) for t in out.token_ids]
            return pool, grown, tokens
        finally:
            await engine.stop()

    pool, grown, tokens = asyncio.run(run())
    assert pool > 2_800 * MB, pool / MB  # 3.02 GB
    assert grown < 1_500 * MB, grown / MB  # the weights (540 MB in float32) and buffers, not the pool
    assert len(tokens) == 4
