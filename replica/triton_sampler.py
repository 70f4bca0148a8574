"""The sampler's CUDA kernels: the chained exponential race of `replica/sampler.py`, and the penalties.

`_sample_kernel` runs one program per row. Its first pass over the row finds the row's maximum,
its softmax normaliser and the race's winner over every token (for a greedy row, the argmax). A
row with top-k, top-p or min-p then checks its winner in a second pass (how many tokens are
strictly more likely, and their mass) and finds, in the same pass, the winner among those more
likely tokens: the next link of the chain, used when the check fails. The loop runs on the
device, so the launch is the same whatever the data: a CUDA graph captures it. The noise is the
same counter-based hash as the torch reference, computed in 32-bit integers.

`_penalty_kernel` casts a row's logits to float32 and, for rows with penalties, applies them from
the penalty state (replica/penalty_state.py) in the same pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replica.sampler import MAX_CHAIN, SamplingTensors

BLOCK = 4096  # vocabulary ids per loop iteration
NUM_WARPS = 16


@triton.jit
def _mix32(x):
    """murmur3's finaliser on uint32 (wrapping arithmetic, as the reference's masked int64)."""
    x = x ^ (x >> 16)
    x = x * _u32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * _u32(0xC2B2AE35)
    return x ^ (x >> 16)


@triton.jit
def _u32(value: tl.constexpr):
    """A uint32 constant (a bare literal above 2**31 would widen the arithmetic to 64 bits)."""
    return tl.full((), value, tl.uint32)


@triton.jit
def _gumbel(row_key, ids):
    """-log(E) for E the reference's exponential noise of (row_key, ids)."""
    bits = _mix32(_mix32(row_key ^ (ids.to(tl.uint32) * _u32(0x85EBCA77))) + row_key)
    uniform = ((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
    return -tl.log(-tl.log(uniform))


@triton.jit
def _sample_kernel(
    logits_ptr, stride, vocab, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, seed_ptr, pos_ptr, out_ptr,
    BLOCK: tl.constexpr, MAX_CHAIN: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * stride
    t = tl.load(temp_ptr + row)
    k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    sampled = (t != 0.0) & (k != 1)
    t = tl.where(sampled, t, 1.0)
    noise_on = tl.where(sampled, 1.0, 0.0)
    seed = tl.load(seed_ptr + row).to(tl.uint32)  # the low 32 bits
    pos = tl.load(pos_ptr + row).to(tl.uint32)
    row_key = _mix32(seed ^ _mix32(pos * _u32(0x9E3779B1) + _u32(0x7F4A7C15)))

    top = float("-inf")
    total = 0.0
    best_key = float("-inf")
    best_id = 0
    for start in range(0, vocab, BLOCK):
        ids = start + tl.arange(0, BLOCK)
        inside = ids < vocab
        x = tl.load(base + ids, mask=inside, other=float("-inf")).to(tl.float32)
        v = tl.where(x == x, x, float("-inf")) / t
        new_top = tl.maximum(top, tl.max(v, axis=0))
        scale = tl.where(new_top == float("-inf"), 0.0, tl.exp(top - new_top))
        terms = tl.where(v == float("-inf"), 0.0, tl.exp(v - new_top))
        total = total * scale + tl.sum(terms, axis=0)
        top = new_top
        key = tl.where(inside, v + _gumbel(row_key, ids) * noise_on, float("-inf"))
        block_key = tl.max(key, axis=0)
        block_id = tl.min(tl.where(key == block_key, ids, vocab), axis=0)
        better = block_key > best_key
        best_id = tl.where(better, block_id, best_id)
        best_key = tl.where(better, block_key, best_key)

    k_on = (k > 0) & (k < vocab)
    floor = tl.where(min_p > 0.0, top + tl.log(min_p), float("-inf"))
    pending = (k_on | (top_p < 1.0) | (min_p > 0.0)) & sampled
    winner = best_id
    links = 0
    while pending:
        at = tl.load(base + winner).to(tl.float32) / t
        count = 0
        mass = 0.0
        next_key = float("-inf")
        next_id = winner
        for start in range(0, vocab, BLOCK):
            ids = start + tl.arange(0, BLOCK)
            inside = ids < vocab
            x = tl.load(base + ids, mask=inside, other=float("-inf")).to(tl.float32)
            v = tl.where(x == x, x, float("-inf")) / t
            above = v > at
            count += tl.sum(above.to(tl.int32), axis=0)
            mass += tl.sum(tl.where(above, tl.exp(v - top), 0.0), axis=0)
            key = tl.where(above & (v >= floor), v + _gumbel(row_key, ids), float("-inf"))
            block_key = tl.max(key, axis=0)
            block_id = tl.min(tl.where(key == block_key, ids, vocab), axis=0)
            better = block_key > next_key
            next_id = tl.where(better, block_id, next_id)
            next_key = tl.where(better, block_key, next_key)
        rejected = (at < floor) | (k_on & (count >= k)) | (mass >= top_p * total)
        winner = tl.where(rejected, next_id, winner)
        links += 1
        pending = rejected & (links < MAX_CHAIN)
    tl.store(out_ptr + row, winner.to(tl.int64))


def sample_rows(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """The kernel over float32 logits [S, vocab] (contiguous rows)."""
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    _sample_kernel[(rows,)](
        logits, logits.stride(0), vocab, params.temperature, params.top_k, params.top_p, params.min_p,
        params.seed, params.position, out, BLOCK=BLOCK, MAX_CHAIN=MAX_CHAIN, num_warps=NUM_WARPS,
    )  # fmt: skip
    return out


@triton.jit
def _penalty_kernel(
    raw_ptr, raw_stride, out_ptr, vocab, slot_ptr, rep_ptr, freq_ptr, pres_ptr, counts_ptr, prompt_ptr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    ids = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = ids < vocab
    x = tl.load(raw_ptr + row * raw_stride + ids, mask=inside, other=0.0).to(tl.float32)
    slot = tl.load(slot_ptr + row)
    if slot >= 0:
        seen = tl.load(counts_ptr + slot * vocab + ids, mask=inside, other=0)
        in_prompt = tl.load(prompt_ptr + slot * vocab + ids, mask=inside, other=0)
        rep = tl.load(rep_ptr + row)
        present = (seen > 0) | (in_prompt != 0)
        x = tl.where(present, tl.where(x > 0, x / rep, x * rep), x)
        appeared = tl.where(seen > 0, 1.0, 0.0)
        x = x - (tl.load(freq_ptr + row) * seen.to(tl.float32) + tl.load(pres_ptr + row) * appeared)
    tl.store(out_ptr + row * vocab + ids, x, mask=inside)


def penalized_logits(
    raw: torch.Tensor,
    slots: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    counts: torch.Tensor,
    prompt: torch.Tensor,
) -> torch.Tensor:
    rows, vocab = raw.shape
    out = torch.empty((rows, vocab), dtype=torch.float32, device=raw.device)
    if rows == 0:
        return out
    grid = (rows, triton.cdiv(vocab, BLOCK))
    _penalty_kernel[grid](
        raw, raw.stride(0), out, vocab, slots, repetition, frequency, presence, counts, prompt, BLOCK=BLOCK
    )
    return out
