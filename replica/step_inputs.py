"""Host-side inputs of one step, built from a plan with numpy (no per-token torch objects)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replica.scheduler import StepPlan


@dataclass
class StepInputs:
    input_ids: np.ndarray  # [T] int64; placeholder rows hold 0
    prev_rows: np.ndarray  # [T] int64; >= 0: take the id from the previous step's samples
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64
    decode_block_tables: np.ndarray  # [D, max_blocks] int64, padded with block 0
    decode_context_lens: np.ndarray  # [D] int64
    prefills: list[tuple[int, int, int, np.ndarray]]  # (q_start, q_len, context_len, block_table)
    sample_rows: np.ndarray  # [S] int64: the row whose hidden state draws each sampled token
    temperature: np.ndarray  # [S] float32
    top_k: np.ndarray  # [S] int64
    top_p: np.ndarray  # [S] float32
    seed: np.ndarray  # [S] int64
    out_position: np.ndarray  # [S] int64: index of the output token being drawn

    @property
    def has_placeholders(self) -> bool:
        return bool((self.prev_rows >= 0).any())


def build_step_inputs(plan: StepPlan, block_size: int) -> StepInputs:
    ids: list[int] = []
    prev_rows: list[int] = []
    positions: list[np.ndarray] = []
    slots: list[np.ndarray] = []
    sample_rows: list[int] = []
    prefills: list[tuple[int, int, int, np.ndarray]] = []
    decode_tables: list[list[int]] = []
    for item in plan.items:
        seq, start, count = item.seq, item.start, item.num_new
        known = seq.tokens[start : start + count]
        ids.extend(known)
        prev_rows.extend([-1] * len(known))
        if len(known) < count:  # the last input token is still on the device
            ids.append(0)
            prev_rows.append(item.prev_row)
        pos = np.arange(start, start + count, dtype=np.int64)
        table = np.asarray(seq.block_table, dtype=np.int64)
        positions.append(pos)
        slots.append(table[pos // block_size] * block_size + pos % block_size)
        row = len(ids) - count
        if count == 1:
            decode_tables.append(seq.block_table)
        else:
            prefills.append((row, count, start + count, table))
        if item.samples:
            sample_rows.append(len(ids) - 1)
    return StepInputs(
        input_ids=np.asarray(ids, dtype=np.int64),
        prev_rows=np.asarray(prev_rows, dtype=np.int64),
        positions=np.concatenate(positions),
        slot_mapping=np.concatenate(slots),
        decode_block_tables=_pad_tables(decode_tables),
        decode_context_lens=np.asarray(
            [it.start + 1 for it in plan.items[: plan.num_decode]], dtype=np.int64
        ),
        prefills=prefills,
        sample_rows=np.asarray(sample_rows, dtype=np.int64),
        **_sampling_arrays(plan),
    )


def _pad_tables(tables: list[list[int]]) -> np.ndarray:
    width = max((len(t) for t in tables), default=1)
    out = np.zeros((len(tables), width), dtype=np.int64)
    for i, table in enumerate(tables):
        out[i, : len(table)] = table
    return out


def _sampling_arrays(plan: StepPlan) -> dict[str, np.ndarray]:
    seqs = [item.seq for item in plan.sampling_items]
    return {
        "temperature": np.asarray([s.params.temperature for s in seqs], dtype=np.float32),
        "top_k": np.asarray([s.params.top_k for s in seqs], dtype=np.int64),
        "top_p": np.asarray([s.params.top_p for s in seqs], dtype=np.float32),
        "seed": np.asarray([s.seed for s in seqs], dtype=np.int64),
        # Pending was counted when the step was planned: the token being drawn is the last one.
        "out_position": np.asarray([s.num_tokens - 1 - s.num_prompt for s in seqs], dtype=np.int64),
    }
