"""The FP8 KV cache (`EngineConfig.kv_cache_dtype = "fp8"`): e4m3 storage, one scale per layer for K
and one for V (per tensor, vLLM's default), and the torch reference of every write and read.

    stored = saturate(x / scale) in e4m3        read = stored · scale, in the compute dtype

A scale is 1.0 unless the checkpoint provides one (`k_scale` / `v_scale` / `kv_scale`, read by
replica/fp8_checkpoint.py). At 1.0 e4m3's range (±448, normal values from 2^-6) covers the keys and
values of the models served: after the projections (and the keys' rotary embedding, which keeps a
head's norm) they are O(1) to O(10); a value past ±448 saturates instead of becoming NaN.

A cache of the model dtype takes the same functions and is left as it is (the scales are unused).
Writes and block copies go through a byte view of an FP8 cache: torch has no `index_copy_` for
float8 tensors. The CUDA kernels (triton_fused.py, triton_decode.py) compute the same casts: the
write multiplies by the scale's float32 reciprocal (so both round alike), the decode kernel applies
the K scale to the scores and the V scale to the output instead of to every element it reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from replica.fp8_quant import FP8_DTYPE, FP8_MAX

KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class KVScales:
    """One layer's per-tensor scales: the K cache holds k / k, the V cache v / v."""

    k: float = 1.0
    v: float = 1.0

    def __post_init__(self) -> None:
        for name, value in (("k", self.k), ("v", self.v)):
            if not (math.isfinite(value) and value > 0.0):
                raise ValueError(f"a KV cache scale must be positive and finite, got {name}={value}")

    @property
    def inverse(self) -> tuple[float, float]:
        """The reciprocals the writes multiply by (the Triton kernels take the same numbers)."""
        return 1.0 / self.k, 1.0 / self.v


UNIT_SCALES = KVScales()


def cache_dtype(setting: str, model_dtype: torch.dtype) -> torch.dtype:
    """The KV cache's element type for `EngineConfig.kv_cache_dtype` ("auto": the model dtype)."""
    if setting not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {setting!r}")
    return FP8_DTYPE if setting == "fp8" else model_dtype


def is_fp8(cache: torch.Tensor) -> bool:
    return cache.dtype == FP8_DTYPE


def quantize_kv(x: torch.Tensor, scale: float) -> torch.Tensor:
    """x · (1 / scale) in float32, saturated at ±448 and rounded to e4m3 (nearest even)."""
    scaled = x.to(torch.float32)
    if scale != 1.0:
        scaled = scaled * (1.0 / scale)
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def dequantize_kv(q: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """e4m3 → `dtype`, times the scale (in float32, rounded once). Exact at scale 1: every e4m3 value
    is a bf16, fp16 and float32 value."""
    if scale == 1.0:
        return q.to(dtype)
    return (q.to(torch.float32) * scale).to(dtype)


def as_read(x: torch.Tensor, cache: torch.Tensor, scale: float) -> torch.Tensor:
    """The step's own keys or values ``x`` as a read of ``cache`` returns them: rounded through e4m3
    when the cache is FP8, unchanged otherwise. A prompt chunk attends to its own keys directly in
    eager steps but gathers them back from the cache in a graphed mixed step; this keeps the two
    paths on the same values, so a step's output does not depend on the path that ran it."""
    return dequantize_kv(quantize_kv(x, scale), scale, x.dtype) if is_fp8(cache) else x


def _bytes(cache: torch.Tensor) -> torch.Tensor:
    """An FP8 cache as uint8 (same storage): the indexing ops torch lacks for float8 run on bytes."""
    return cache.view(torch.uint8) if is_fp8(cache) else cache


def store(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, scale: float) -> None:
    """x [tokens, kv_heads, D] into cache [blocks, block_size, kv_heads, D] at flat `slots`."""
    heads, dim = cache.shape[-2:]
    if is_fp8(cache):
        cache.view(torch.uint8).view(-1, heads, dim).index_copy_(
            0, slots, quantize_kv(x, scale).view(torch.uint8)
        )
    else:
        cache.view(-1, heads, dim).index_copy_(0, slots, x.to(cache.dtype))


def gather(cache: torch.Tensor, index: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """cache[index] (any index shape over the first dimension), dequantised to `dtype` when FP8."""
    if not is_fp8(cache):
        return cache[index]
    return dequantize_kv(_bytes(cache)[index].view(FP8_DTYPE), scale, dtype)


def gather_slots(cache: torch.Tensor, slots: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """The tokens at flat `slots` ([n] → [n, kv_heads, D]), dequantised to `dtype` when FP8."""
    flat = _bytes(cache).flatten(0, 1).index_select(0, slots)
    return dequantize_kv(flat.view(FP8_DTYPE), scale, dtype) if is_fp8(cache) else flat


def copy_blocks(cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """cache[dst] = cache[src] (forks' partial last blocks): a copy of bytes, any dtype."""
    raw = _bytes(cache)
    raw.index_copy_(0, dst, raw.index_select(0, src))
