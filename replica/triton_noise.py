"""The sampler's noise on CUDA: the torch reference's counter-based hash (replica/sampler.py), in
32-bit integers, and each row's setup (whether it samples, its temperature, its key)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _u32(value: tl.constexpr):
    """A uint32 constant (a bare literal above 2**31 would widen the arithmetic to 64 bits)."""
    return tl.full((), value, tl.uint32)


@triton.jit
def _mix32(x):
    """murmur3's finaliser on uint32 (wrapping arithmetic, as the reference's masked int64)."""
    x = x ^ (x >> 16)
    x = x * _u32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * _u32(0xC2B2AE35)
    return x ^ (x >> 16)


@triton.jit
def _gumbel(row_key, ids):
    """-log(E) for E the reference's exponential noise of (row_key, ids)."""
    bits = _mix32(_mix32(row_key ^ (ids.to(tl.uint32) * _u32(0x85EBCA77))) + row_key)
    # Held below 1 as the reference's (replica/sampler.py uniform_from_bits): the top value rounds to 1.
    uniform = tl.minimum(((bits >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0), 0.99999994)
    return -tl.log(-tl.log(uniform))


@triton.jit
def _row_setup(row, temp_ptr, top_k_ptr, seed_ptr, pos_ptr):
    """(sampled, temperature to divide by, the row's noise key)."""
    t = tl.load(temp_ptr + row)
    sampled = (t != 0.0) & (tl.load(top_k_ptr + row) != 1)
    seed = tl.load(seed_ptr + row).to(tl.uint32)  # the low 32 bits
    pos = tl.load(pos_ptr + row).to(tl.uint32)
    row_key = _mix32(seed ^ _mix32(pos * _u32(0x9E3779B1) + _u32(0x7F4A7C15)))
    return sampled, tl.where(sampled, t, 1.0), row_key
