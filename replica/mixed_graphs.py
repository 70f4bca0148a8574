"""CUDA graphs for mixed steps: decode rows plus prompt chunks that each start their sequence.

An eager step is enqueued from Python one kernel at a time: about 22 ms for a SmolLM2 step on the
H200, whatever its size, while the device needs 1-10 ms. New requests arrive all the time in a
serving replica, so many steps carry a prompt beside the decode rows and would run eagerly.

A graph needs fixed shapes and fixed addresses, so a mixed step is padded to a rung of a token
ladder (16, 32, ... up to the step budget) and every per-step fact lives in the step's IO buffer:
- tokens past the step's own read token 0 and write the reserved cache block 0;
- the paged decode kernel runs over `rows` = min(tokens, max_seqs) rows: the step's decode rows,
  then rows whose output is replaced (prompt rows) or dropped (padding, which reads block 0);
- one flash varlen call covers every chunk at `max_chunks` packed offsets, shifted past the decode
  rows on the device; unused chunk slots repeat the last offset (zero-length sequences);
- a per-row select keeps the decode kernel's output for rows below `num_decode`, flash's after;
- `rows` sample rows are drawn (padded ones greedily, without penalties); the host reads only the
  step's own; padded tokens' penalty bookkeeping writes the penalty state's pad row.

Chunks that continue a sequence read earlier keys from the cache through a gather whose size
depends on the step: those steps stay eager, as do steps that score prompt tokens or ask for
logprobs. Each (step kind, IO set, ladder rung) has its own graph; they share one memory pool.
"""

from __future__ import annotations

import numpy as np
import torch

from replica.attention_metadata import AttentionMetadata, DecodeKernelShape

MAX_CHUNKS = 16  # prompt chunks one mixed graph takes; the flash grid grows with it


def token_ladder(max_tokens: int) -> tuple[int, ...]:
    """Powers of two from 16 below the step budget, and the budget itself."""
    rungs, size = [], 16
    while size < max_tokens:
        rungs.append(size)
        size *= 2
    return (*rungs, max_tokens)


def graph_rows(tokens: int, max_seqs: int) -> int:
    """Decode and sample rows a graph of `tokens` tokens computes."""
    return min(tokens, max_seqs)


def eligible(prefills: list[tuple[int, int, int, int]]) -> bool:
    """A step a mixed graph can run: at most MAX_CHUNKS chunks, each starting its sequence."""
    if not prefills or len(prefills) > MAX_CHUNKS:
        return False
    return all(q_len == ctx for _, q_len, ctx, _ in prefills)


def pad_inputs(arrays: dict[str, np.ndarray], layout, tokens: int, rows: int, pad_marks: np.ndarray) -> None:
    """Fill the padded part of a step's host buffers (after `fill_step` wrote the step's own)."""
    t, nd, s, n = layout.num_tokens, layout.num_decode, layout.num_samples, len(layout.prefills)
    pad = slice(t, tokens)
    for name in ("input_ids", "positions", "slot_mapping"):
        arrays[name][pad] = 0
    arrays["prev_rows"][pad] = -1
    arrays["mark_index"][pad] = arrays["count_index"][pad] = pad_marks[t:tokens]
    arrays["decode_tables"][nd:rows, 0] = 0  # a padded decode row reads block 0 only
    arrays["decode_lens"][nd:rows] = 1
    arrays["sample_rows"][s:rows] = 0
    pad_samples(arrays, s, rows)
    for name in ("prefill_cu_q", "prefill_cu_k"):
        arrays[name][n + 1 : MAX_CHUNKS + 1] = arrays[name][n]
    arrays["num_decode"][0] = nd


def pad_samples(arrays: dict[str, np.ndarray], used: int, rows: int) -> None:
    """Padded sample rows draw greedily, keep no penalty counts (a stale slot would count into a
    live sequence's row) and take no token mask."""
    pad = slice(used, rows)
    arrays["temperature"][pad] = 0.0
    arrays["top_k"][pad] = 0
    arrays["penalty_slot"][pad] = -1
    arrays["mask_row"][pad] = -1


def metadata(
    dev: dict[str, torch.Tensor],
    tokens: int,
    rows: int,
    decode_kernel: DecodeKernelShape = DecodeKernelShape(),
) -> AttentionMetadata:
    """The fixed-shape attention inputs of a mixed graph over the IO set `dev`."""
    bounds = slice(0, MAX_CHUNKS + 1)
    return AttentionMetadata(
        slot_mapping=dev["slot_mapping"][:tokens], num_decode=rows,
        decode_block_tables=dev["decode_tables"][:rows], decode_context_lens=dev["decode_lens"][:rows],
        prefills=[], decode_backend="triton", prefill_backend="flash_padded",
        prefill_cu_q=dev["prefill_cu_q"][bounds], prefill_cu_k=dev["prefill_cu_k"][bounds],
        prefill_max_q=tokens, prefill_max_k=tokens, decode_rows=dev["num_decode"],
        decode_kernel=decode_kernel,
    )  # fmt: skip
