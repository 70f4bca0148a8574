"""Fill a step's IO buffers from its plan: numpy writes into preallocated arrays, no torch objects."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from replica.io_buffers import StepBuffers
from replica.scheduler import StepPlan


@dataclass
class StepLayout:
    """Sizes and host-side facts of a filled step (what the runner needs without touching the device)."""

    num_tokens: int
    num_decode: int
    num_samples: int
    decode_width: int  # blocks in the longest decode table this step
    prefills: list[tuple[int, int, int, int]] = field(default_factory=list)  # q_start, q_len, ctx, table row
    prefill_max_q: int = 0  # longest chunk (queries) and longest context (keys) this step
    prefill_max_k: int = 0
    has_placeholders: bool = False
    all_greedy: bool = True
    any_top_k: bool = False
    any_top_p: bool = False


def fill_step(plan: StepPlan, buf: StepBuffers, block_size: int) -> StepLayout:
    arrays = buf.np
    decode = plan.items[: plan.num_decode]
    nd = len(decode)
    width = 0
    placeholders = False
    if nd:
        width = _fill_decode(decode, plan.block_rows, arrays, block_size)
        placeholders = bool((arrays["prev_rows"][:nd] >= 0).any())
    layout = StepLayout(plan.num_tokens, nd, 0, width, has_placeholders=placeholders)
    row = nd
    for index, item in enumerate(plan.items[nd:]):
        _fill_chunk(item, row, index, arrays, block_size)
        layout.prefills.append((row, item.num_new, item.start + item.num_new, index))
        row += item.num_new
    if layout.prefills:
        _fill_chunk_bounds(layout, arrays)
    _fill_sampling(plan, arrays, layout)
    return layout


def _fill_decode(decode: list, block_rows: np.ndarray, arrays: dict[str, np.ndarray], block_size: int) -> int:
    """Decode rows, vectorised: one token each, at position `start`."""
    nd = len(decode)
    # One pass over the items: start, carried row, table row, and the input token when the host knows it.
    rows = np.array(
        [(i.start, i.prev_row, i.seq.row, i.seq.tokens[i.start] if i.prev_row < 0 else 0) for i in decode],
        np.int64,
    )
    starts = rows[:, 0]
    width = int(starts.max()) // block_size + 1  # every table holds at least its position's block
    tables = block_rows[rows[:, 2], :width]
    arrays["input_ids"][:nd] = rows[:, 3]
    arrays["prev_rows"][:nd] = rows[:, 1]
    arrays["positions"][:nd] = starts
    arrays["slot_mapping"][:nd] = (
        tables[np.arange(nd), starts // block_size] * block_size + starts % block_size
    )
    arrays["decode_tables"][:nd, :width] = tables
    arrays["decode_lens"][:nd] = starts + 1
    return width


def _fill_chunk(item, row: int, index: int, arrays: dict[str, np.ndarray], block_size: int) -> None:
    """A multi-token chunk of a prompt (or of a recomputation): all its tokens are known on the host."""
    seq, start, count = item.seq, item.start, item.num_new
    rows = slice(row, row + count)
    pos = np.arange(start, start + count, dtype=np.int64)
    table = seq.block_array
    arrays["input_ids"][rows] = seq.tokens[start : start + count]
    arrays["prev_rows"][rows] = -1
    arrays["positions"][rows] = pos
    arrays["slot_mapping"][rows] = table[pos // block_size] * block_size + pos % block_size
    arrays["prefill_tables"][index, : len(seq.block_table)] = table[: len(seq.block_table)]


def _fill_chunk_bounds(layout: StepLayout, arrays: dict[str, np.ndarray]) -> None:
    """Packed offsets for one varlen attention call over all chunks: queries and keys back to back."""
    q_lens = np.array([q_len for _, q_len, _, _ in layout.prefills], np.int32)
    k_lens = np.array([ctx for _, _, ctx, _ in layout.prefills], np.int32)
    n = len(q_lens)
    arrays["prefill_cu_q"][0] = arrays["prefill_cu_k"][0] = 0
    np.cumsum(q_lens, out=arrays["prefill_cu_q"][1 : n + 1])
    np.cumsum(k_lens, out=arrays["prefill_cu_k"][1 : n + 1])
    layout.prefill_max_q, layout.prefill_max_k = int(q_lens.max()), int(k_lens.max())


def _fill_sampling(plan: StepPlan, arrays: dict[str, np.ndarray], layout: StepLayout) -> None:
    items = plan.items
    picked = [index for index, item in enumerate(items) if item.samples]
    if plan.num_tokens == len(items):  # pure decode: item i is row i
        rows = np.asarray(picked)
    else:  # a sampled item's row is the last of its tokens
        rows = (np.cumsum([item.num_new for item in items]) - 1)[picked]
    sampling = [items[index] for index in picked]
    s = len(sampling)
    layout.num_samples = s
    if s == 0:
        return
    seqs = [item.seq for item in sampling]
    table = np.array([q.sampling_row for q in seqs], dtype=np.float64)  # (s, 4)
    arrays["sample_rows"][:s] = rows
    arrays["temperature"][:s] = table[:, 0]
    arrays["top_k"][:s] = table[:, 1]
    arrays["top_p"][:s] = table[:, 2]
    arrays["seed"][:s] = table[:, 3]
    # Pending was counted when the step was planned: the token being drawn is the last one.
    arrays["out_position"][:s] = [len(q.tokens) + q.num_pending - 1 - q.num_prompt for q in seqs]
    layout.all_greedy = bool((table[:, 0] == 0).all())
    layout.any_top_k = bool((table[:, 1] > 0).any())
    layout.any_top_p = bool((table[:, 2] < 1).any())
