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
    has_placeholders: bool = False
    all_greedy: bool = True
    any_top_k: bool = False
    any_top_p: bool = False

    def copy_counts(self) -> dict[str, int]:
        t, d, s, p = self.num_tokens, self.num_decode, self.num_samples, len(self.prefills)
        return {
            "input_ids": t, "prev_rows": t, "positions": t, "slot_mapping": t, "decode_tables": d,
            "decode_lens": d, "prefill_tables": p, "sample_rows": s, "temperature": s, "top_k": s,
            "top_p": s, "seed": s, "out_position": s,
        }  # fmt: skip


def fill_step(plan: StepPlan, buf: StepBuffers, block_size: int) -> StepLayout:
    arrays = buf.np
    decode = plan.items[: plan.num_decode]
    nd = len(decode)
    width = 0
    placeholders = False
    if nd:
        width = _fill_decode(decode, arrays, block_size)
        placeholders = bool((arrays["prev_rows"][:nd] >= 0).any())
    layout = StepLayout(plan.num_tokens, nd, 0, width, has_placeholders=placeholders)
    row = nd
    for index, item in enumerate(plan.items[nd:]):
        _fill_chunk(item, row, index, arrays, block_size)
        layout.prefills.append((row, item.num_new, item.start + item.num_new, index))
        row += item.num_new
    _fill_sampling(plan, arrays, layout)
    return layout


def _fill_decode(decode: list, arrays: dict[str, np.ndarray], block_size: int) -> int:
    """Decode rows, vectorised: one token each, at position `start`."""
    nd = len(decode)
    seqs = [item.seq for item in decode]
    starts = np.fromiter((item.start for item in decode), dtype=np.int64, count=nd)
    prev = np.fromiter((item.prev_row for item in decode), dtype=np.int64, count=nd)
    known = np.fromiter(
        (s.tokens[i.start] if i.prev_row < 0 else 0 for s, i in zip(seqs, decode, strict=True)), np.int64, nd
    )
    width = max(len(s.block_table) for s in seqs)
    tables = np.stack([s.block_array[:width] for s in seqs])
    arrays["input_ids"][:nd] = known
    arrays["prev_rows"][:nd] = prev
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


def _fill_sampling(plan: StepPlan, arrays: dict[str, np.ndarray], layout: StepLayout) -> None:
    rows, seqs, row = [], [], 0
    for item in plan.items:
        row += item.num_new
        if item.samples:
            rows.append(row - 1)
            seqs.append(item.seq)
    s = len(seqs)
    layout.num_samples = s
    arrays["sample_rows"][:s] = rows
    arrays["temperature"][:s] = [q.params.temperature for q in seqs]
    arrays["top_k"][:s] = [q.params.top_k for q in seqs]
    arrays["top_p"][:s] = [q.params.top_p for q in seqs]
    arrays["seed"][:s] = [q.seed for q in seqs]
    # Pending was counted when the step was planned: the token being drawn is the last one.
    arrays["out_position"][:s] = [q.num_tokens - 1 - q.num_prompt for q in seqs]
    layout.all_greedy = bool((arrays["temperature"][:s] == 0).all())
    layout.any_top_k = bool((arrays["top_k"][:s] > 0).any())
    layout.any_top_p = bool((arrays["top_p"][:s] < 1).any())
