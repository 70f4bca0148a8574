"""The fixed-shape inputs a mixed CUDA graph reads, built on the CPU: a graph takes MAX_CHUNKS prompt
chunks whatever the engine's max_num_seqs, so an engine of 4 sequences (fractional replicas sharing a
card run such engines) must still hold MAX_CHUNKS chunks' bounds and block tables."""

from __future__ import annotations

import numpy as np
import torch

import replica.mixed_graphs as mixed
from replica.io_buffers import StepBuffers

BLOCK = 16


def buffers(max_seqs: int) -> StepBuffers:
    return StepBuffers(torch.device("cpu"), 64, max_seqs, table_width=8, max_chunks=mixed.MAX_CHUNKS)


def fill_chunks(buf: StepBuffers, contexts: list[int], tables: list[list[int]]) -> None:
    """A step's chunk bounds and block tables, padded as a mixed graph's step is (pad_inputs)."""
    cu_k = buf.np["prefill_cu_k"]
    cu_k[0] = 0
    np.cumsum(contexts, out=cu_k[1 : len(contexts) + 1])
    cu_k[len(contexts) + 1 : mixed.MAX_CHUNKS + 1] = cu_k[len(contexts)]
    for row, blocks in enumerate(tables):
        buf.np["prefill_tables"][row, : len(blocks)] = blocks


def test_a_small_engine_holds_every_chunk_a_mixed_graph_reads() -> None:
    buf = buffers(max_seqs=4)
    assert buf.np["prefill_cu_k"].shape[0] == mixed.MAX_CHUNKS + 1
    assert buf.np["prefill_cu_q"].shape[0] == mixed.MAX_CHUNKS + 1
    assert buf.np["prefill_tables"].shape[0] == mixed.MAX_CHUNKS
    assert buf.np["decode_tables"].shape[0] == 4  # per-sequence fields keep the engine's size


def test_context_keys_map_to_their_cache_slots_with_four_sequences() -> None:
    buf = buffers(max_seqs=4)
    fill_chunks(buf, contexts=[20, 7], tables=[[5, 6], [9]])
    slots = mixed.key_slots(buf.dev, keys=40, block_size=BLOCK).tolist()
    first = [5 * BLOCK + g for g in range(16)] + [6 * BLOCK + g for g in range(4)]
    second = [9 * BLOCK + p for p in range(7)]
    assert slots == first + second + [0] * 13  # keys past the last chunk read the reserved block 0
    meta = mixed.metadata(buf.dev, tokens=32, rows=4, context=40, block_size=BLOCK)
    assert meta.prefill_cu_k.shape[0] == mixed.MAX_CHUNKS + 1
    assert meta.prefill_cu_k[:3].tolist() == [0, 20, 27]


def test_an_engine_larger_than_a_graph_keeps_a_row_per_sequence() -> None:
    buf = buffers(max_seqs=64)
    assert buf.np["prefill_tables"].shape[0] == 64
    assert buf.np["prefill_cu_k"].shape[0] == 65
