"""Logprobs on CUDA, inside the step's graph: the chosen token's logprob and the top MAX_LOGPROBS of
each row that asked, from the raw logits in the dtype the LM head wrote them (no float32 copy).

Two launches of fixed shape, so a graph replays them for any mix of rows:
1. `_split_kernel` (rows x splits): each split holds its span of the row in registers, and writes
   its maximum, its sum of exp(x - max) and its own top K (ids and values, best first);
2. `_combine_kernel` (rows): the row's log-normaliser from the splits' (max, sum) pairs, the chosen
   token's logprob, and the row's top K among the splits' candidates.
A row whose `want` is negative (it did not ask) leaves both launches at once: rows that did not ask
pay a program that returns, and steps without a logprob row skip nothing else. Ties go to the
lowest id. Values are float32 log-softmax of the raw logits: the reference is
`replica/step_sampler.py`'s torch path (the CPU's).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replica.sampling_params import MAX_LOGPROBS

SPAN = 4096  # vocabulary ids one program holds (32 splits for a 128k vocabulary)
NUM_WARPS = 8


@triton.jit
def _split_kernel(
    logits_ptr, stride, vocab, want_ptr, part_max_ptr, part_sum_ptr, part_val_ptr, part_id_ptr, splits,
    K: tl.constexpr, SPAN: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    if tl.load(want_ptr + row) < 0:
        return
    split = tl.program_id(1)
    ids = split * SPAN + tl.arange(0, SPAN)
    valid = ids < vocab
    x = tl.load(logits_ptr + row * stride + ids, mask=valid, other=float("-inf")).to(tl.float32)
    top = tl.max(x, axis=0)
    total = tl.sum(tl.where(valid, tl.exp(x - top), 0.0), axis=0)
    part = row * splits + split
    tl.store(part_max_ptr + part, top)
    tl.store(part_sum_ptr + part, total)
    alive = valid
    for j in tl.static_range(K):  # the span's best K, one reduction pair each, all in registers
        best = tl.max(tl.where(alive, x, float("-inf")), axis=0)
        pick = tl.min(tl.where(alive & (x == best), ids, vocab), axis=0)
        tl.store(part_val_ptr + part * K + j, best)
        tl.store(part_id_ptr + part * K + j, pick)
        alive = alive & (ids != pick)


@triton.jit
def _combine_kernel(
    logits_ptr, stride, vocab, want_ptr, tokens_ptr, part_max_ptr, part_sum_ptr, part_val_ptr, part_id_ptr,
    splits, logprob_ptr, top_val_ptr, top_id_ptr, out_stride,
    K: tl.constexpr, SPLITS: tl.constexpr, CANDIDATES: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    if tl.load(want_ptr + row) < 0:
        return
    s = tl.arange(0, SPLITS)
    maxes = tl.load(part_max_ptr + row * splits + s, mask=s < splits, other=float("-inf"))
    sums = tl.load(part_sum_ptr + row * splits + s, mask=s < splits, other=0.0)
    top = tl.max(maxes, axis=0)
    norm = top + tl.log(tl.sum(sums * tl.exp(maxes - top), axis=0))
    token = tl.load(tokens_ptr + row)
    chosen = tl.load(logits_ptr + row * stride + token).to(tl.float32)
    tl.store(logprob_ptr + row, chosen - norm)
    c = tl.arange(0, CANDIDATES)
    alive = c < splits * K
    values = tl.load(part_val_ptr + row * splits * K + c, mask=alive, other=float("-inf"))
    ids = tl.load(part_id_ptr + row * splits * K + c, mask=alive, other=vocab)
    for j in tl.static_range(K):
        best = tl.max(tl.where(alive, values, float("-inf")), axis=0)
        pick = tl.min(tl.where(alive & (values == best), ids, vocab), axis=0)
        tl.store(top_val_ptr + row * out_stride + j, best - norm)
        tl.store(top_id_ptr + row * out_stride + j, pick)
        alive = alive & (ids != pick)


def logprob_rows(
    raw: torch.Tensor, tokens: torch.Tensor, want: torch.Tensor, out: dict[str, torch.Tensor]
) -> None:
    """Fill out["logprob"], out["top_logprobs"] and out["top_ids"] for the rows of `raw` [S, vocab]
    whose `want` [S] is >= 0; `tokens` [S] are the step's draws."""
    rows, vocab = raw.shape
    splits = triton.cdiv(vocab, SPAN)
    k = min(MAX_LOGPROBS, vocab)
    dev = raw.device
    part_max = torch.empty((rows, splits), dtype=torch.float32, device=dev)
    part_sum = torch.empty((rows, splits), dtype=torch.float32, device=dev)
    part_val = torch.empty((rows, splits, k), dtype=torch.float32, device=dev)
    part_id = torch.empty((rows, splits, k), dtype=torch.int64, device=dev)
    _split_kernel[(rows, splits)](
        raw, raw.stride(0), vocab, want, part_max, part_sum, part_val, part_id, splits,
        K=k, SPAN=SPAN, num_warps=NUM_WARPS,
    )  # fmt: skip
    top_val, top_id = out["top_logprobs"], out["top_ids"]
    _combine_kernel[(rows,)](
        raw, raw.stride(0), vocab, want, tokens, part_max, part_sum, part_val, part_id, splits,
        out["logprob"], top_val, top_id, top_val.stride(0),
        K=k, SPLITS=triton.next_power_of_2(splits), CANDIDATES=triton.next_power_of_2(splits * k),
        num_warps=4,
    )  # fmt: skip
