"""Fill a step's IO buffers from its plan: numpy writes into preallocated arrays, no torch objects."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from replica.grammar_masks import constrained_rows
from replica.io_buffers import StepBuffers
from replica.scheduler import StepPlan
from replica.sequence import Sequence


@dataclass(frozen=True)
class FillContext:
    """What the input builder needs besides the plan: the cache geometry and the vocabulary."""

    block_size: int
    vocab: int
    pad_marks: np.ndarray  # flat penalty-state indices of the pad row, one per token row


@dataclass
class PromptLogprobChunk:
    """Rows [row, row + count) of a step score the prompt tokens after positions [start, start + count)."""

    seq: Sequence
    row: int
    count: int


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
    plain_greedy: bool = True  # every row is a plain argmax and no sequence keeps penalty counts
    logprobs: bool = False  # some row asks for logprobs
    num_bias: int = 0
    num_resets: int = 0
    num_copies: int = 0  # KV blocks copied after the step (forks)
    num_row_copies: int = 0  # penalty rows copied after the step (forks)
    marks: bool = False  # some chunk belongs to a sequence with penalties
    prompt_logprobs: list[PromptLogprobChunk] = field(default_factory=list)
    grammar_rows: list[int] = field(default_factory=list)  # sample rows under a grammar (masks to fill)
    num_masks: int = 0  # token-mask rows filled (after the grammar matchers caught up)


def fill_step(plan: StepPlan, buf: StepBuffers, ctx: FillContext) -> StepLayout:
    arrays = buf.np
    decode = plan.items[: plan.num_decode]
    nd = len(decode)
    width = 0
    placeholders = False
    if nd:
        width = _fill_decode(decode, plan.block_rows, arrays, ctx.block_size)
        placeholders = bool((arrays["prev_rows"][:nd] >= 0).any())
    layout = StepLayout(plan.num_tokens, nd, 0, width, has_placeholders=placeholders)
    row = nd
    if nd < plan.num_tokens:
        arrays["mark_index"][: plan.num_tokens] = ctx.pad_marks[: plan.num_tokens]
        arrays["count_index"][: plan.num_tokens] = ctx.pad_marks[: plan.num_tokens]
    for index, item in enumerate(plan.items[nd:]):
        _fill_chunk(item, row, index, arrays, ctx.block_size)
        layout.prefills.append((row, item.num_new, item.start + item.num_new, index))
        if item.seq.penalized:
            _fill_marks(item, row, arrays, ctx)
            layout.marks = True
        if _scores_prompt(item):
            layout.prompt_logprobs.append(_fill_targets(item, row, arrays))
        row += item.num_new
    if layout.prefills:
        _fill_chunk_bounds(layout, arrays)
    _fill_sampling(plan, arrays, layout, ctx.vocab)
    _fill_resets_and_forks(plan, arrays, layout)
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


def _fill_marks(item, row: int, arrays: dict[str, np.ndarray], ctx: FillContext) -> None:
    """Penalty bookkeeping of a chunk: prompt tokens set their flag, output tokens (a recomputation's)
    add to their count, in the sequence's row of the penalty state."""
    seq, start, count = item.seq, item.start, item.num_new
    ids = np.asarray(seq.tokens[start : start + count], dtype=np.int64)
    flat = seq.row * ctx.vocab + ids
    is_prompt = np.arange(start, start + count) < seq.num_prompt
    pads = ctx.pad_marks[row : row + count]
    arrays["mark_index"][row : row + count] = np.where(is_prompt, flat, pads)
    arrays["count_index"][row : row + count] = np.where(is_prompt, pads, flat)


def _scores_prompt(item) -> bool:
    """The chunk holds prompt positions whose next token's logprob the request wants and has not
    had planned (a recomputation after a preemption scores nothing twice)."""
    seq = item.seq
    if seq.params.prompt_logprobs is None:
        return False
    return item.start <= seq.prompt_scored < min(item.start + item.num_new, seq.num_prompt - 1)


def _fill_targets(item, row: int, arrays: dict[str, np.ndarray]) -> PromptLogprobChunk:
    """The next prompt token after each position the chunk scores, from the sequence's first
    unplanned position to the chunk's end (0 past the prompt: those rows are unused)."""
    seq = item.seq
    first, end = seq.prompt_scored, item.start + item.num_new
    count = end - first
    known = seq.tokens[first + 1 : min(end + 1, seq.num_prompt)]
    targets = np.zeros(count, dtype=np.int64)
    targets[: len(known)] = known
    at = row + first - item.start
    arrays["target_ids"][at : at + count] = targets
    seq.prompt_scored = min(end, seq.num_prompt - 1)
    return PromptLogprobChunk(seq, at, count)


def _fill_chunk_bounds(layout: StepLayout, arrays: dict[str, np.ndarray]) -> None:
    """Packed offsets for one varlen attention call over all chunks: queries and keys back to back."""
    q_lens = np.array([q_len for _, q_len, _, _ in layout.prefills], np.int32)
    k_lens = np.array([ctx for _, _, ctx, _ in layout.prefills], np.int32)
    n = len(q_lens)
    arrays["prefill_cu_q"][0] = arrays["prefill_cu_k"][0] = 0
    np.cumsum(q_lens, out=arrays["prefill_cu_q"][1 : n + 1])
    np.cumsum(k_lens, out=arrays["prefill_cu_k"][1 : n + 1])
    layout.prefill_max_q, layout.prefill_max_k = int(q_lens.max()), int(k_lens.max())


def _fill_sampling(plan: StepPlan, arrays: dict[str, np.ndarray], layout: StepLayout, vocab: int) -> None:
    items = plan.items
    seqs = plan.sample_seqs
    s = len(seqs)
    layout.num_samples = s
    layout.plain_greedy = not layout.marks and all(q.plain_greedy for q in seqs)
    if s == 0:
        return
    if plan.num_tokens == len(items):  # pure decode: item i is row i
        rows = np.asarray(plan.sample_items)
    else:  # a sampled item's row is the last of its tokens
        rows = (np.cumsum([item.num_new for item in items]) - 1)[plan.sample_items]
    arrays["sample_rows"][:s] = rows
    table = np.array([q.sampling_row for q in seqs], dtype=np.float64)  # (s, 9)
    for column, name in enumerate(
        ("temperature", "top_k", "top_p", "min_p", "seed", "repetition_penalty", "frequency_penalty")
    ):
        arrays[name][:s] = table[:, column]
    arrays["presence_penalty"][:s] = table[:, 7]
    # Pending was counted when the step was planned: the token being drawn is the last one.
    arrays["out_position"][:s] = [len(q.tokens) + q.num_pending - 1 - q.num_prompt for q in seqs]
    if layout.plain_greedy:
        return
    arrays["penalty_slot"][:s] = [q.row if q.penalized else -1 for q in seqs]
    arrays["mask_row"][:s] = -1  # constrained rows get theirs when their masks are filled
    layout.grammar_rows = constrained_rows(seqs)
    arrays["logprob_k"][:s] = table[:, 8]  # read from the row table: no second pass over the rows
    layout.logprobs = bool(table[:, 8].max() >= 0)
    _fill_bias(seqs, arrays, layout, vocab)


def _fill_bias(seqs: list[Sequence], arrays: dict[str, np.ndarray], layout: StepLayout, vocab: int) -> None:
    """logit_bias and min_tokens bans as flat (row * vocab + id, value) entries."""
    at = 0
    for s, q in enumerate(seqs):
        if not q.params.logit_bias and not q.params.min_tokens:
            continue
        ids, values = q.bias_entries()
        n = len(ids)
        if n:
            arrays["bias_index"][at : at + n] = np.asarray(ids, dtype=np.int64) + s * vocab
            arrays["bias_value"][at : at + n] = values
            at += n
    arrays["num_bias"][0] = at
    layout.num_bias = at


def _fill_resets_and_forks(plan: StepPlan, arrays: dict[str, np.ndarray], layout: StepLayout) -> None:
    """Penalty rows cleared before the step; forks' KV blocks and prompt rows copied after it."""
    resets = [item.seq.row for item in plan.items if item.start == 0 and item.seq.penalized]
    resets += [f.child.row for f in plan.forks if f.child.penalized]
    copies = [f.copy for f in plan.forks if f.copy is not None]
    row_copies = [(f.parent.row, f.child.row) for f in plan.forks if f.child.penalized]
    layout.num_resets, layout.num_copies, layout.num_row_copies = len(resets), len(copies), len(row_copies)
    arrays["reset_slots"][: len(resets)] = resets
    for (src, dst), pairs in (
        (("copy_src", "copy_dst"), copies),
        (("row_copy_src", "row_copy_dst"), row_copies),
    ):
        for i, (a, b) in enumerate(pairs):
            arrays[src][i], arrays[dst][i] = a, b
