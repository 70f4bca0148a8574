"""The engine's sizes: what a config leaves unset follows the device (replica/engine_sizes.py)."""

from __future__ import annotations

import pytest

from replica import EngineConfig
from replica.engine import Engine
from replica.engine_sizes import (
    CPU_BATCHED_TOKENS,
    CPU_MAX_SEQS,
    CUDA_BATCHED_TOKENS,
    CUDA_MAX_SEQS,
    SLOT_CONTEXT_TOKENS,
    choose_sizes,
    share_room,
)
from replica.errors import InvalidRequestError

GIB = 1 << 30
BLOCK = 16
# Llama-3.1-8B's KV per block in bf16: 2 (K, V) × 32 layers × 8 KV heads × 128 dims × 2 bytes × 16 tokens.
LLAMA_8B_BLOCK_BYTES = 2 * 32 * 8 * 128 * 2 * BLOCK


def on_cuda(free_gib: float, **given) -> dict:
    sizes = choose_sizes(
        on_cuda=True,
        block_size=BLOCK,
        max_num_seqs=given.get("max_num_seqs"),
        max_num_batched_tokens=given.get("max_num_batched_tokens"),
        num_kv_blocks=given.get("num_kv_blocks"),
        cpu_kv_tokens=4096,
        free_bytes=int(free_gib * GIB),
        memory_fraction=0.85,
        kv_bytes_per_block=LLAMA_8B_BLOCK_BYTES,
    )
    return sizes.as_dict()


def test_an_h200_with_the_8b_shape_gets_the_top_slots_and_the_gpu_step_budget() -> None:
    sizes = on_cuda(free_gib=123.0)  # 141 GB less 16 GB of weights and the CUDA context
    assert sizes["num_kv_blocks"] == int(123.0 * GIB * 0.85) // LLAMA_8B_BLOCK_BYTES
    assert sizes["kv_tokens"] > CUDA_MAX_SEQS * SLOT_CONTEXT_TOKENS
    assert sizes["max_num_seqs"] == CUDA_MAX_SEQS == 128
    assert sizes["max_num_batched_tokens"] == CUDA_BATCHED_TOKENS == 2048
    assert set(sizes["chosen"]) == {"num_kv_blocks", "max_num_seqs", "max_num_batched_tokens"}


@pytest.mark.parametrize(
    ("free_gib", "slots"),
    [
        (6.0, 16),  # a 24-GB card beside 16 GB of weights: 41,760 KV tokens, 20 slots of 2,048 → rung 16
        (12.0, 32),  # 83,536 tokens → 40 → rung 32
        (20.0, 64),  # 139,248 tokens → 67 → rung 64
        (0.2, 1),  # 1,376 tokens: one slot, never none
    ],
)
def test_slots_are_the_largest_ladder_rung_whose_slots_each_hold_a_long_context(free_gib, slots) -> None:
    sizes = on_cuda(free_gib)
    assert sizes["max_num_seqs"] == slots
    assert slots == 1 or slots * SLOT_CONTEXT_TOKENS <= sizes["kv_tokens"]


def test_sizes_the_config_sets_are_kept_as_they_are() -> None:
    sizes = on_cuda(free_gib=123.0, max_num_seqs=200, max_num_batched_tokens=4096, num_kv_blocks=1000)
    assert (sizes["max_num_seqs"], sizes["max_num_batched_tokens"], sizes["num_kv_blocks"]) == (
        200,
        4096,
        1000,
    )
    assert sizes["chosen"] == []
    # A KV pool set small still bounds the slots the engine chooses: 999 blocks × 16 = 15,984 tokens.
    assert on_cuda(123.0, num_kv_blocks=1000)["max_num_seqs"] == 4


def test_the_cpu_keeps_its_small_sizes() -> None:
    sizes = choose_sizes(
        on_cuda=False,
        block_size=BLOCK,
        max_num_seqs=None,
        max_num_batched_tokens=None,
        num_kv_blocks=None,
        cpu_kv_tokens=8192,
    )
    assert (sizes.max_num_seqs, sizes.max_num_batched_tokens) == (CPU_MAX_SEQS, CPU_BATCHED_TOKENS)
    assert sizes.kv_tokens == 8192


async def test_a_cpu_engine_reports_what_it_chose_and_runs_with_it() -> None:
    engine = Engine(EngineConfig(device="cpu", kv_cache_tokens=2048, max_num_batched_tokens=256))
    await engine.start()
    try:
        facts = engine.describe()
        assert facts["device"] == "cpu" and facts["dtype"] == "float32"
        assert facts["max_num_seqs"] == CPU_MAX_SEQS and facts["max_num_batched_tokens"] == 256
        assert facts["kv_tokens"] == 2048
        assert set(facts["chosen"]) == {"num_kv_blocks", "max_num_seqs"}
        assert engine.core.scheduler.max_num_seqs == CPU_MAX_SEQS
    finally:
        await engine.stop()


def test_a_replica_sharing_a_card_sizes_its_kv_from_its_share_not_from_all_free_memory() -> None:
    """Three replicas at 0.3 of a 141-GiB card: the first (2.5 GiB of weights held) may take 0.3 ×
    141 − 2.5 GiB however much is free; a later one finds less free than its share and takes what
    is free; one whose weights already fill its share gets nothing."""
    total = 141 * GIB
    assert share_room(free=138 * GIB, total=total, held=int(2.5 * GIB), share=0.3) == int(0.3 * total) - int(
        2.5 * GIB
    )
    assert share_room(free=10 * GIB, total=total, held=int(2.5 * GIB), share=0.3) == 10 * GIB
    assert share_room(free=100 * GIB, total=total, held=50 * GIB, share=0.3) == 0
    with pytest.raises(InvalidRequestError, match="gpu_memory_share"):
        EngineConfig(gpu_memory_share=1.5)


def test_a_fractional_gpu_replica_is_given_its_share_and_a_whole_one_none() -> None:
    from cluster.app import engine_kwargs, gpu_share
    from cluster.model_settings import ModelSettings

    shared = ModelSettings(name="m", engine={"model": "llama-3.2-1b", "device": "cuda"}, replica_num_gpus=0.3)
    assert (
        gpu_share(shared) == 0.3
        and engine_kwargs(shared.engine, gpu_share(shared))["gpu_memory_share"] == 0.3
    )
    assert EngineConfig(**engine_kwargs(shared.engine, 0.3)).gpu_memory_share == 0.3
    for whole in (None, 1.0, 0.0):
        assert gpu_share(ModelSettings(name="m", replica_num_gpus=whole)) is None
