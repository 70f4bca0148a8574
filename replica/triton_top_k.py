"""The sampler's top-k threshold on CUDA: the k-th largest logit of each pending top-k row, exactly,
by a radix select over the logits' order-preserving 32-bit keys, a byte at a time from the top.

Each of the four rounds is `_radix_pass` (rows x splits: each split's 256-bin histogram of the
round's byte, among the tokens whose higher bytes match the prefix found so far) and
`_radix_combine` (rows: the bin where the count from the top reaches what is left of k). After the
last round the prefix is the k-th largest key; the row's floor becomes that logit over T. A token
at or above it has fewer than k tokens strictly above it, so the chain (replica/triton_sampler.py)
looks only there and converges as for top-p: the top-k check costs four row reads, not the
log2(vocab / k) links of the chain on a flat row (670 µs at 32 rows of 128k ids on the H200).
Rows without top-k leave every launch at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replica.triton_noise import _u32

BLOCK = 1024
BINS = 256
# Splits' histograms summed per loop iteration of `_radix_combine`. The shift and the split count
# are run-time values, so the combine compiles once: as constants (one build per round and per
# power-of-two split count) its 28 builds took 185 s of a cold H200 replica's 217-s start.
SPLIT_TILE = 16


@triton.jit
def _key(x):
    """uint32 keys in the order of the float32 values (NaN reads as -inf, below every real value)."""
    x = tl.where(x == x, x, float("-inf"))
    bits = x.to(tl.uint32, bitcast=True)
    negative = (bits >> 31) != 0
    return tl.where(negative, bits ^ _u32(0xFFFFFFFF), bits | _u32(0x80000000))


@triton.jit
def _wants(row, top_k_ptr, temp_ptr, pending_ptr, vocab):
    k = tl.load(top_k_ptr + row)
    sampled = tl.load(temp_ptr + row) != 0.0
    return (tl.load(pending_ptr + row) != 0) & sampled & (k > 1) & (k < vocab)


@triton.jit
def _radix_pass(
    logits_ptr, stride, vocab, span, top_k_ptr, temp_ptr, pending_ptr, prefix_ptr, hist_ptr, splits,
    SHIFT: tl.constexpr, BLOCK: tl.constexpr, BINS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    if _wants(row, top_k_ptr, temp_ptr, pending_ptr, vocab) == 0:
        return
    split = tl.program_id(1)
    prefix = tl.load(prefix_ptr + row).to(tl.uint32)
    counts = tl.zeros([BINS], tl.int32)
    lo = split * span
    hi = tl.minimum(lo + span, vocab)
    for start in range(lo, hi, BLOCK):
        ids = start + tl.arange(0, BLOCK)
        key = _key(tl.load(logits_ptr + row * stride + ids, mask=ids < hi, other=float("-inf")))
        match = ids < hi
        if SHIFT < 24:
            match = match & ((key >> (SHIFT + 8)) == (prefix >> (SHIFT + 8)))
        counts += tl.histogram(((key >> SHIFT) & 0xFF).to(tl.int32), BINS, mask=match)
    tl.store(hist_ptr + (row * splits + split) * BINS + tl.arange(0, BINS), counts)


@triton.jit(do_not_specialize=["splits", "shift"])
def _radix_combine(
    hist_ptr, splits, vocab, top_k_ptr, temp_ptr, pending_ptr, prefix_ptr, left_ptr, floor_ptr, shift,
    TILE: tl.constexpr, BINS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    if _wants(row, top_k_ptr, temp_ptr, pending_ptr, vocab) == 0:
        return
    s = tl.arange(0, TILE)
    b = tl.arange(0, BINS)
    counts = tl.zeros([BINS], tl.int32)
    for first in range(0, splits, TILE):  # the splits' histograms, TILE at a time
        at = (row * splits + first + s[:, None]) * BINS + b[None, :]
        counts += tl.sum(tl.load(hist_ptr + at, mask=(first + s < splits)[:, None], other=0), axis=0)
    left = tl.load(left_ptr + row)
    # The k-th largest (the `left`-th among this prefix's tokens) lies in the bin with fewer than
    # `left` tokens in the bins above it and at least `left` counting its own.
    above = tl.sum(counts, axis=0) - tl.cumsum(counts, axis=0)  # tokens in the bins above each bin
    fits = (above < left) & (above + counts >= left)
    chosen = tl.max(tl.where(fits, b, -1), axis=0)
    chosen = tl.where(chosen < 0, 0, chosen)
    left = left - tl.sum(tl.where(b == chosen, above, 0), axis=0)
    prefix = tl.load(prefix_ptr + row).to(tl.uint32) | (chosen.to(tl.uint32) << shift.to(tl.uint32))
    tl.store(prefix_ptr + row, prefix.to(tl.int64))
    tl.store(left_ptr + row, left)
    if shift == 0:  # the k-th largest key: back to its logit, over T
        bits = tl.where((prefix >> 31) != 0, prefix & 0x7FFFFFFF, prefix ^ _u32(0xFFFFFFFF))
        x = bits.to(tl.float32, bitcast=True)
        tl.store(floor_ptr + row, x / tl.load(temp_ptr + row))


def top_k_floor(logits: torch.Tensor, span: int, splits: int, params, pending: torch.Tensor) -> torch.Tensor:
    """Per row: the k-th largest logit over T for pending top-k rows, -inf for the others."""
    rows, vocab = logits.shape
    dev = logits.device
    floor = torch.full((rows,), float("-inf"), dtype=torch.float32, device=dev)
    prefix = torch.zeros(rows, dtype=torch.int64, device=dev)
    left = params.top_k.to(torch.int32)
    hist = torch.empty((rows, splits, BINS), dtype=torch.int32, device=dev)
    p = params
    for shift in (24, 16, 8, 0):
        _radix_pass[(rows, splits)](
            logits, logits.stride(0), vocab, span, p.top_k, p.temperature, pending, prefix, hist, splits,
            SHIFT=shift, BLOCK=BLOCK, BINS=BINS, num_warps=4,
        )  # fmt: skip
        _radix_combine[(rows,)](
            hist, splits, vocab, p.top_k, p.temperature, pending, prefix, left, floor, shift,
            TILE=SPLIT_TILE, BINS=BINS, num_warps=4,
        )  # fmt: skip
    return floor
