"""The sampler's top-k path on CUDA: a pending row with 1 < top_k < K is decided from its K most
likely tokens, which hold its whole allowed set, in two launches that cost only such rows.

1. `_top_k_candidates` (rows x splits): each split keeps the K largest of its span, as int64 keys
   that pack the logit's order-preserving bits over the token id (ties: the lower id first);
2. `_top_k_draw` (rows): the row's K largest keys out of its splits', then, over those tokens, how
   many are strictly more likely and their mass (a K x K comparison), the joint filter, and the race.

A tie group reaching past the K-th token (the K-th token's count of more likely tokens is below
top_k) could hide allowed tokens: such a row stays pending for the chain. Rows without top-k leave
at once, so a step without top-k pays two empty launches. (The chain needs about log2(vocab / k)
links on a flat row: 670 µs at 32 rows of 128k ids on the H200; torch's topk of 128 cost 150 µs.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replica.triton_noise import _gumbel, _row_setup

K = 128
CHUNK = 2048
_LOWEST = tl.constexpr(-9223372036854775807)  # below every packed key


@triton.jit
def _packed(x, ids):
    """int64 keys ordered as the float32 values, then by lower id: bits of x (negatives flipped)
    above 0x7FFFFFFF - id."""
    bits = x.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - ids).to(tl.int64)


@triton.jit
def _wants_top_k(row, top_k_ptr, pending_ptr, K: tl.constexpr):
    k = tl.load(top_k_ptr + row)
    return (tl.load(pending_ptr + row) != 0) & (k > 1) & (k < K)


@triton.jit
def _top_k_candidates(
    logits_ptr, stride, vocab, span, top_k_ptr, pending_ptr, cand_ptr, splits, K: tl.constexpr,
    CHUNK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    if _wants_top_k(row, top_k_ptr, pending_ptr, K) == 0:
        return
    split = tl.program_id(1)
    base = logits_ptr + row * stride
    best = tl.full([K], _LOWEST, tl.int64)
    lo = split * span
    hi = tl.minimum(lo + span, vocab)
    for start in range(lo, hi, CHUNK):
        ids = start + tl.arange(0, CHUNK)
        x = tl.load(base + ids, mask=ids < hi, other=float("-inf"))
        x = tl.where(x == x, x, float("-inf"))
        keys = tl.where(ids < hi, _packed(x, ids), _LOWEST)
        best = tl.topk(tl.cat(best, tl.topk(keys, K), can_reorder=True), K)
    tl.store(cand_ptr + (row * splits + split) * K + tl.arange(0, K), best)


@triton.jit
def _top_k_draw(
    logits_ptr, stride, vocab, cand_ptr, splits, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, pos_ptr,
    top_ptr, total_ptr, pending_ptr, out_ptr, K: tl.constexpr, SPLITS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    if _wants_top_k(row, top_k_ptr, pending_ptr, K) == 0:
        return
    at = tl.arange(0, SPLITS * K)
    keys = tl.load(cand_ptr + row * splits * K + at, mask=at < splits * K, other=_LOWEST)
    best = tl.topk(keys, K)  # best first
    ids = (0x7FFFFFFF - (best & 0xFFFFFFFF)).to(tl.int32)
    real = (best != _LOWEST) & (ids < vocab)
    _sampled, t, row_key = _row_setup(row, temp_ptr, top_k_ptr, seed_ptr, pos_ptr)
    x = tl.load(logits_ptr + row * stride + ids, mask=real, other=float("-inf"))
    v = tl.where(x == x, x, float("-inf")) / t
    top = tl.load(top_ptr + row)
    greater = v[None, :] > v[:, None]  # [j, i]: token i strictly more likely than token j
    count = tl.sum(greater.to(tl.int32), axis=1)
    mass = tl.sum(tl.where(greater, tl.exp(v[None, :] - top), 0.0), axis=1)
    k = tl.load(top_k_ptr + row)
    last_count = tl.sum(tl.where(tl.arange(0, K) == K - 1, count, 0), axis=0)
    if last_count >= k:  # the allowed set lies inside these K tokens
        min_p = tl.load(min_p_ptr + row)
        floor = tl.where(min_p > 0.0, top + tl.log(min_p), float("-inf"))
        top_p_mass = tl.load(top_p_ptr + row) * tl.load(total_ptr + row)
        allowed = (count < k) & (mass < top_p_mass) & (v >= floor) & (v > float("-inf"))
        race = tl.where(allowed, v + _gumbel(row_key, ids), float("-inf"))
        best_key = tl.max(race, axis=0)
        winner = tl.min(tl.where(race == best_key, ids, vocab), axis=0)
        tl.store(out_ptr + row, tl.minimum(winner, vocab - 1).to(tl.int64))
        tl.store(pending_ptr + row, 0)


def launch_top_k(logits, span: int, splits: int, params, top, total, pending, out) -> None:
    """Decide the pending top-k rows (the module docstring); the others are left as they are."""
    rows, vocab = logits.shape
    if vocab <= K:
        return
    cand = torch.empty((rows, splits, K), dtype=torch.int64, device=logits.device)
    p = params
    _top_k_candidates[(rows, splits)](
        logits, logits.stride(0), vocab, span, p.top_k, pending, cand, splits, K=K, CHUNK=CHUNK, num_warps=8
    )
    _top_k_draw[(rows,)](
        logits, logits.stride(0), vocab, cand, splits, p.temperature, p.top_k, p.top_p, p.min_p, p.seed,
        p.position, top, total, pending, out, K=K, SPLITS=triton.next_power_of_2(splits), num_warps=8,
    )  # fmt: skip
