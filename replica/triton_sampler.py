"""The sampler's CUDA kernels: the chained exponential race of `replica/sampler.py`, and the penalties.

A row is split over several programs, so a batch of 32 rows of a 128k vocabulary keeps the whole
GPU busy (one program per row measured 90 µs per pass on the H200; the noise hash and its logs
make the pass compute-heavy as well as memory-heavy). Launches, all of fixed shape:

1. `_race_kernel` (rows x splits): each split's maximum of v = logits / T and the race's winner
   (for a greedy row, the argmax) over its span, kept per lane and reduced once at the end;
2. `_race_combine` (rows): the row's maximum, normaliser and winner; rows with top-k, top-p or
   min-p are marked pending;
3. for pending top-k rows, the k-th largest logit by a radix select (replica/triton_top_k.py): the
   row's floor, below which the chain does not look;
4. `_check_kernel` + `_check_combine`, twice: for pending rows, how many tokens are strictly more
   likely than the winner, their mass and the total mass, and the next link of the chain (the
   race's winner among those more likely tokens); the winner is accepted or replaced;
5. `_chain_tail` (rows): the rare row still pending walks the rest of the chain in one program.

The noise is the same counter-based hash as the torch reference (replica/triton_noise.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replica.sampling_tensors import MAX_CHAIN, SamplingTensors
from replica.triton_noise import _gumbel, _row_setup
from replica.triton_top_k import top_k_floor

BLOCK = 1024  # vocabulary ids per loop iteration of one program
NUM_WARPS = 4
PARALLEL_LINKS = 2  # chain checks spread over the whole GPU before the one-program tail
TARGET_PROGRAMS = 528  # about four per multiprocessor of an H200


@triton.jit
def _values(base, ids, vocab, t):
    """v = logits / T over `ids` (NaN and ids past the vocabulary read as -inf)."""
    x = tl.load(base + ids, mask=ids < vocab, other=float("-inf")).to(tl.float32)
    return tl.where(x == x, x, float("-inf")) / t


@triton.jit
def _argmax_lanes(keys, ids, vocab):
    """The best key of per-lane bests and its lowest id (ties go to the lowest id, as argmax)."""
    best = tl.max(keys, axis=0)
    return best, tl.min(tl.where(keys == best, ids, vocab), axis=0)


@triton.jit
def _race_kernel(
    logits_ptr, stride, vocab, span, temp_ptr, top_k_ptr, seed_ptr, pos_ptr, part_max_ptr, part_total_ptr,
    part_key_ptr, part_id_ptr, splits, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    base = logits_ptr + row * stride
    sampled, t, row_key = _row_setup(row, temp_ptr, top_k_ptr, seed_ptr, pos_ptr)
    noise = tl.where(sampled, 1.0, 0.0)
    top = tl.full([BLOCK], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK], tl.float32)  # per lane: sum of exp(v - top)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_id = tl.zeros([BLOCK], tl.int32)
    for start in range(split * span, tl.minimum(split * span + span, vocab), BLOCK):
        ids = start + tl.arange(0, BLOCK)
        v = _values(base, ids, vocab, t)
        new_top = tl.maximum(top, v)
        rescale = tl.where(new_top == float("-inf"), 0.0, tl.exp(top - new_top))
        total = total * rescale + tl.where(v == float("-inf"), 0.0, tl.exp(v - new_top))
        top = new_top
        key = tl.where(ids < vocab, v + _gumbel(row_key, ids) * noise, float("-inf"))
        better = key > best
        best = tl.where(better, key, best)
        best_id = tl.where(better, ids, best_id)
    key, index = _argmax_lanes(best, best_id, vocab)
    at = row * splits + split
    split_top = tl.max(top, axis=0)
    weight = tl.where(top == float("-inf"), 0.0, tl.exp(top - split_top))
    tl.store(part_max_ptr + at, split_top)
    tl.store(part_total_ptr + at, tl.sum(total * weight, axis=0))
    tl.store(part_key_ptr + at, key)
    tl.store(part_id_ptr + at, index)


@triton.jit
def _race_combine(
    part_max_ptr, part_total_ptr, part_key_ptr, part_id_ptr, splits, vocab, temp_ptr, top_k_ptr, top_p_ptr,
    min_p_ptr, top_ptr, total_ptr, pending_ptr, out_ptr, SPLITS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, SPLITS)
    inside = s < splits
    tops = tl.load(part_max_ptr + row * splits + s, mask=inside, other=float("-inf"))
    top = tl.max(tops, axis=0)
    totals = tl.load(part_total_ptr + row * splits + s, mask=inside, other=0.0)
    tl.store(
        total_ptr + row, tl.sum(tl.where(tops == float("-inf"), 0.0, totals * tl.exp(tops - top)), axis=0)
    )
    keys = tl.load(part_key_ptr + row * splits + s, mask=inside, other=float("-inf"))
    ids = tl.load(part_id_ptr + row * splits + s, mask=inside, other=vocab)
    _, winner = _argmax_lanes(keys, ids, vocab)
    k = tl.load(top_k_ptr + row)
    sampled = (tl.load(temp_ptr + row) != 0.0) & (k != 1)
    filtered = ((k > 0) & (k < vocab)) | (tl.load(top_p_ptr + row) < 1.0) | (tl.load(min_p_ptr + row) > 0.0)
    tl.store(top_ptr + row, top)
    tl.store(pending_ptr + row, (sampled & filtered).to(tl.int32))
    tl.store(out_ptr + row, tl.minimum(winner, vocab - 1).to(tl.int64))


@triton.jit
def _check_span(base, lo, hi, vocab, t, top, at, floor, row_key, BLOCK: tl.constexpr):
    """Over ids [lo, hi): tokens strictly above `at` (count, and mass relative to exp(top)), and the
    race's winner among tokens above `at` and at or over `floor`."""
    count = tl.zeros([BLOCK], tl.int32)
    mass = tl.zeros([BLOCK], tl.float32)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_id = tl.zeros([BLOCK], tl.int32)
    for start in range(lo, hi, BLOCK):
        ids = start + tl.arange(0, BLOCK)
        v = _values(base, ids, vocab, t)
        above = v > at
        count += above.to(tl.int32)
        mass += tl.where(above, tl.exp(v - top), 0.0)
        key = tl.where(above & (v >= floor), v + _gumbel(row_key, ids), float("-inf"))
        better = key > best
        best = tl.where(better, key, best)
        best_id = tl.where(better, ids, best_id)
    key, index = _argmax_lanes(best, best_id, vocab)
    return tl.sum(count, axis=0), tl.sum(mass, axis=0), key, index


@triton.jit
def _floor(top, min_p_ptr, k_floor_ptr, row):
    """The lowest v a token may have: min-p's, and a top-k row's k-th largest (replica/triton_top_k.py)."""
    min_p = tl.load(min_p_ptr + row)
    return tl.maximum(tl.where(min_p > 0.0, top + tl.log(min_p), float("-inf")), tl.load(k_floor_ptr + row))


@triton.jit
def _check_kernel(
    logits_ptr, stride, vocab, span, temp_ptr, top_k_ptr, seed_ptr, pos_ptr, min_p_ptr, k_floor_ptr,
    top_ptr, pending_ptr, out_ptr, part_count_ptr, part_mass_ptr, part_key_ptr, part_id_ptr, splits,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    if tl.load(pending_ptr + row) == 0:
        return
    split = tl.program_id(1)
    base = logits_ptr + row * stride
    _, t, row_key = _row_setup(row, temp_ptr, top_k_ptr, seed_ptr, pos_ptr)
    top = tl.load(top_ptr + row)
    at = tl.load(base + tl.load(out_ptr + row)).to(tl.float32) / t
    lo = split * span
    count, mass, key, index = _check_span(
        base,
        lo,
        tl.minimum(lo + span, vocab),
        vocab,
        t,
        top,
        at,
        _floor(top, min_p_ptr, k_floor_ptr, row),
        row_key,
        BLOCK,
    )
    slot = row * splits + split
    tl.store(part_count_ptr + slot, count)
    tl.store(part_mass_ptr + slot, mass)
    tl.store(part_key_ptr + slot, key)
    tl.store(part_id_ptr + slot, index)


@triton.jit
def _rejected(at, floor, count, mass, total, top_k_ptr, top_p_ptr, row, vocab):
    k = tl.load(top_k_ptr + row)
    k_on = (k > 0) & (k < vocab)
    return (at < floor) | (k_on & (count >= k)) | (mass >= tl.load(top_p_ptr + row) * total)


@triton.jit
def _check_combine(
    logits_ptr, stride, vocab, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, k_floor_ptr, top_ptr, total_ptr,
    pending_ptr, out_ptr, part_count_ptr, part_mass_ptr, part_key_ptr, part_id_ptr, splits,
    SPLITS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    if tl.load(pending_ptr + row) == 0:
        return
    s = tl.arange(0, SPLITS)
    inside = s < splits
    part = row * splits + s
    count = tl.sum(tl.load(part_count_ptr + part, mask=inside, other=0), axis=0)
    mass = tl.sum(tl.load(part_mass_ptr + part, mask=inside, other=0.0), axis=0)
    total = tl.load(total_ptr + row)
    keys = tl.load(part_key_ptr + part, mask=inside, other=float("-inf"))
    _, next_id = _argmax_lanes(keys, tl.load(part_id_ptr + part, mask=inside, other=vocab), vocab)
    t = tl.load(temp_ptr + row)
    winner = tl.load(out_ptr + row)
    at = tl.load(logits_ptr + row * stride + winner).to(tl.float32) / t
    top = tl.load(top_ptr + row)
    floor = _floor(top, min_p_ptr, k_floor_ptr, row)
    if _rejected(at, floor, count, mass, total, top_k_ptr, top_p_ptr, row, vocab):
        tl.store(out_ptr + row, tl.minimum(next_id, vocab - 1).to(tl.int64))
    else:
        tl.store(pending_ptr + row, 0)


@triton.jit
def _chain_tail(
    logits_ptr, stride, vocab, temp_ptr, top_k_ptr, top_p_ptr, min_p_ptr, k_floor_ptr, seed_ptr, pos_ptr,
    top_ptr, total_ptr, pending_ptr, out_ptr, LINKS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    pending = tl.load(pending_ptr + row) != 0
    base = logits_ptr + row * stride
    _sampled, t, row_key = _row_setup(row, temp_ptr, top_k_ptr, seed_ptr, pos_ptr)
    top = tl.load(top_ptr + row)
    total = tl.load(total_ptr + row)
    floor = _floor(top, min_p_ptr, k_floor_ptr, row)
    winner = tl.load(out_ptr + row).to(tl.int32)
    links = 0
    while pending:
        at = tl.load(base + winner).to(tl.float32) / t
        count, mass, _next_key, next_id = _check_span(
            base, 0, vocab, vocab, t, top, at, floor, row_key, BLOCK
        )
        rejected = _rejected(at, floor, count, mass, total, top_k_ptr, top_p_ptr, row, vocab)
        winner = tl.where(rejected, tl.minimum(next_id, vocab - 1), winner)
        links += 1
        pending = rejected & (links < LINKS)
    tl.store(out_ptr + row, winner.to(tl.int64))


def sample_rows(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """The kernels over float32 logits [S, vocab] (contiguous rows)."""
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    blocks = triton.cdiv(vocab, BLOCK)
    splits = max(1, min(blocks, triton.cdiv(TARGET_PROGRAMS, rows)))
    span = triton.cdiv(blocks, splits) * BLOCK
    splits = triton.cdiv(vocab, span)
    width = triton.next_power_of_2(splits)
    f32 = dict(dtype=torch.float32, device=logits.device)
    i32 = dict(dtype=torch.int32, device=logits.device)
    part_max, part_total, part_key, part_mass = (torch.empty((rows, splits), **f32) for _ in range(4))
    part_id, part_count = (torch.empty((rows, splits), **i32) for _ in range(2))
    top, total = torch.empty(rows, **f32), torch.empty(rows, **f32)
    pending = torch.empty(rows, **i32)
    p = params
    grid = (rows, splits)
    _race_kernel[grid](
        logits, logits.stride(0), vocab, span, p.temperature, p.top_k, p.seed, p.position, part_max,
        part_total, part_key, part_id, splits, BLOCK=BLOCK, num_warps=NUM_WARPS,
    )  # fmt: skip
    _race_combine[(rows,)](
        part_max, part_total, part_key, part_id, splits, vocab, p.temperature, p.top_k, p.top_p, p.min_p, top,
        total, pending, out, SPLITS=width,
    )  # fmt: skip
    k_floor = top_k_floor(logits, span, splits, params, pending)
    parts = (part_count, part_mass, part_key, part_id)
    for _ in range(PARALLEL_LINKS):
        _check_kernel[grid](
            logits, logits.stride(0), vocab, span, p.temperature, p.top_k, p.seed, p.position, p.min_p,
            k_floor, top, pending, out, *parts, splits, BLOCK=BLOCK, num_warps=NUM_WARPS,
        )  # fmt: skip
        _check_combine[(rows,)](
            logits, logits.stride(0), vocab, p.temperature, p.top_k, p.top_p, p.min_p, k_floor, top, total,
            pending, out, *parts, splits, SPLITS=width,
        )  # fmt: skip
    _chain_tail[(rows,)](
        logits, logits.stride(0), vocab, p.temperature, p.top_k, p.top_p, p.min_p, k_floor, p.seed,
        p.position, top, total, pending, out, LINKS=MAX_CHAIN - PARALLEL_LINKS, BLOCK=4096, num_warps=16,
    )  # fmt: skip
    return out
