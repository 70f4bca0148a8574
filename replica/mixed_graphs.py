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

A chunk that continues its sequence (a prompt after a cached prefix, a long prompt's later chunks)
attends to earlier keys in the cache. Such steps run in *context graphs*, which add a second rung:
the number of keys gathered. The graph derives each packed key's cache slot on the device from the
chunk offsets and the chunks' block tables (`key_slots`), gathers that many keys and values per layer
(padding reads block 0), and hands flash the packed context at `prefill_cu_k`; the host fills
nothing more than for a fresh chunk. Without them, the first token after a cache hit waited for an
eager step (about 22 ms of kernel launches for an 8B step, several times its device time).
Steps that score prompt tokens stay eager; rows that ask for logprobs ride the sample kind's
graphs. Each (step kind, context rung, IO set, token rung) has its own graph; the fresh-chunk
graphs share one memory pool, the context graphs another.
"""

from __future__ import annotations

import numpy as np
import torch

from replica.attention_metadata import AttentionMetadata, DecodeKernelShape

MAX_CHUNKS = 16  # prompt chunks one mixed graph takes; the flash grid grows with it
CONTEXT_TOKENS = 1024  # the largest token rung of context graphs: bigger steps are bound by compute
FIRST_CONTEXT_RUNG, MAX_CONTEXT_RUNG = 1024, 32768  # gathered keys: a rung per power of two


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


def context_ladder(max_keys: int) -> tuple[int, ...]:
    """Gathered-key rungs of the context graphs: powers of two up to what a step can hold."""
    top = min(max_keys, MAX_CONTEXT_RUNG)
    rungs, size = [], FIRST_CONTEXT_RUNG
    while size < top:
        rungs.append(size)
        size *= 2
    return (*rungs, top) if top >= FIRST_CONTEXT_RUNG else ()


def eligible(prefills: list[tuple[int, int, int, int]]) -> bool:
    """A step a mixed graph can run: at most MAX_CHUNKS chunks, each starting its sequence."""
    return fits(prefills) and context_keys(prefills) == 0


def fits(prefills: list[tuple[int, int, int, int]]) -> bool:
    return 0 < len(prefills) <= MAX_CHUNKS


def context_keys(prefills: list[tuple[int, int, int, int]]) -> int:
    """Keys a context graph gathers for the step (every chunk's whole context), or 0 when every
    chunk starts its sequence (its keys are the step's own rows: no gather)."""
    if all(q_len == ctx for _, q_len, ctx, _ in prefills):
        return 0
    return sum(ctx for _, _, ctx, _ in prefills)


def key_slots(dev: dict[str, torch.Tensor], keys: int, block_size: int) -> torch.Tensor:
    """The flat cache slot of each of `keys` packed keys, on the device (fixed shapes: graphable).

    Key g belongs to the chunk c whose span [cu_k[c], cu_k[c + 1]) holds it, at position
    g - cu_k[c] of its sequence, whose block the chunk's row of `prefill_tables` names. Keys past
    the step's last chunk read slot 0 (block 0 is reserved)."""
    bounds = dev["prefill_cu_k"][: MAX_CHUNKS + 1].long()
    tables = dev["prefill_tables"]
    g = torch.arange(keys, device=bounds.device)
    chunk = (torch.searchsorted(bounds, g, right=True) - 1).clamp(0, MAX_CHUNKS - 1)
    pos = g - bounds[chunk]
    block = tables[chunk, (pos // block_size).clamp(max=tables.shape[1] - 1)]
    return torch.where(g < bounds[MAX_CHUNKS], block * block_size + pos % block_size, 0)


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
    live sequence's row), take no token mask and score no logprobs."""
    pad = slice(used, rows)
    arrays["temperature"][pad] = 0.0
    arrays["top_k"][pad] = 0
    arrays["penalty_slot"][pad] = -1
    arrays["mask_row"][pad] = -1
    arrays["logprob_k"][pad] = -1


def metadata(
    dev: dict[str, torch.Tensor],
    tokens: int,
    rows: int,
    decode_kernel: DecodeKernelShape = DecodeKernelShape(),
    context: int = 0,
    block_size: int = 16,
) -> AttentionMetadata:
    """The fixed-shape attention inputs of a mixed graph over the IO set `dev`; `context` > 0: a
    context graph gathering that many keys."""
    bounds = slice(0, MAX_CHUNKS + 1)
    slots = key_slots(dev, context, block_size) if context else None
    return AttentionMetadata(
        slot_mapping=dev["slot_mapping"][:tokens], num_decode=rows,
        decode_block_tables=dev["decode_tables"][:rows], decode_context_lens=dev["decode_lens"][:rows],
        prefills=[], decode_backend="triton", prefill_backend="flash_padded",
        prefill_cu_q=dev["prefill_cu_q"][bounds], prefill_cu_k=dev["prefill_cu_k"][bounds],
        prefill_max_q=tokens, prefill_max_k=context or tokens, decode_rows=dev["num_decode"],
        decode_kernel=decode_kernel, prefill_key_slots=slots,
    )  # fmt: skip
