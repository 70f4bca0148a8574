"""Fused Triton kernels for the CUDA decode path: fewer, larger launches per layer.

Per layer the unfused torch path launches about 35 kernels, most of them tiny elementwise ops on a
[batch, hidden] tensor; at batch 32 their launch gaps cost more than their work. These three fuse
them: residual add + RMSNorm, rotary embedding + KV-cache write, SiLU × up. Each rounds to the model
dtype where transformers' torch code rounds, so results track the reference op for op.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replica.kv_quant import UNIT_SCALES, KVScales, is_fp8

FP8_MAX = tl.constexpr(448.0)  # e4m3's largest value (fp8_quant.py); kernels read constexpr globals only


@triton.jit
def to_cache(x, inv_scale, dt: tl.constexpr, FP8: tl.constexpr):
    """x as the cache stores it: FP8, x · (1 / scale) in float32 saturated at ±448 and rounded to
    e4m3 (replica/kv_quant.py `quantize_kv`); otherwise x cast to the cache's dtype."""
    if FP8:
        scaled = x.to(tl.float32) * inv_scale
        return tl.minimum(tl.maximum(scaled, -FP8_MAX), FP8_MAX).to(dt)
    else:
        return x.to(dt)


@triton.jit
def _add_rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, dim, eps, part_stride,
    BLOCK: tl.constexpr, HAS_RES: tl.constexpr, PARTS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < dim
    if PARTS == 0:
        x = tl.load(x_ptr + row * dim + cols, mask=mask, other=0.0)
    else:  # x arrives as float32 partial sums over slices of K: add them, round as a GEMM would
        acc = tl.zeros([BLOCK], tl.float32)
        for p in tl.static_range(PARTS):
            acc += tl.load(x_ptr + p * part_stride + row * dim + cols, mask=mask, other=0.0)
        x = acc.to(out_ptr.dtype.element_ty)
    if HAS_RES:
        r = tl.load(res_ptr + row * dim + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(res_ptr.dtype.element_ty)  # the residual add, rounded
        tl.store(res_ptr + row * dim + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / dim + eps)
    normed = (xf * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * dim + cols, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """RMSNorm(x + residual) with `residual += x` in place; without a residual, plain RMSNorm(x).

    x may be [parts, rows, dim] float32 partial products (see `linear_partials`): they are summed
    and rounded to the residual's dtype first."""
    parts = x.shape[0] if x.dim() == 3 else 0
    rows, dim = x.shape[-2:]
    dtype = residual.dtype if residual is not None else x.dtype
    out = torch.empty((rows, dim), dtype=dtype, device=x.device)
    _add_rmsnorm_kernel[(rows,)](
        x, residual if residual is not None else x, weight, out, dim, eps, rows * dim,
        BLOCK=triton.next_power_of_2(dim), HAS_RES=residual is not None, PARTS=parts, num_warps=8,
    )  # fmt: skip
    return out


def linear_partials(x: torch.Tensor, weight: torch.Tensor, parts: int) -> torch.Tensor:
    """x @ weight.T as `parts` float32 partial products over slices of K: [parts, rows, out].

    cuBLAS splits a skinny GEMM's K itself and adds the slices in a separate reduce kernel; here the
    slices are a batched GEMM and the next `add_rmsnorm` adds them, one launch fewer per GEMM."""
    rows, k = x.shape
    n = weight.shape[0]
    xs = x.view(rows, parts, k // parts).transpose(0, 1)  # [parts, rows, k/parts]
    ws = weight.view(n, parts, k // parts).permute(1, 2, 0)  # [parts, k/parts, n]
    return torch.bmm(xs, ws, out_dtype=torch.float32)


@triton.jit
def _rope_cache_kernel(
    qkv_ptr, pos_ptr, table_ptr, slot_ptr, k_cache_ptr, v_cache_ptr, stride_tok, inv_k, inv_v,
    Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, DIM: tl.constexpr, HALF: tl.constexpr, FP8: tl.constexpr,
):  # fmt: skip
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    dt = qkv_ptr.dtype.element_ty
    pos = tl.load(pos_ptr + tok)
    d = tl.arange(0, HALF)
    base = qkv_ptr + tok * stride_tok + head * DIM
    x1 = tl.load(base + d).to(tl.float32)
    x2 = tl.load(base + HALF + d).to(tl.float32)
    row = table_ptr + pos * 2 * DIM  # table [positions, 2 (cos, sin), DIM] float32
    cos = tl.load(row + d).to(dt).to(tl.float32)
    sin = tl.load(row + DIM + d).to(dt).to(tl.float32)
    # transformers: q * cos + rotate_half(q) * sin, each product and the sum rounded to the dtype
    o1 = ((x1 * cos).to(dt).to(tl.float32) + (-x2 * sin).to(dt).to(tl.float32)).to(dt)
    o2 = ((x2 * cos).to(dt).to(tl.float32) + (x1 * sin).to(dt).to(tl.float32)).to(dt)
    tl.store(base + d, o1)
    tl.store(base + HALF + d, o2)
    if head >= Q_HEADS:
        kv_head = head - Q_HEADS
        slot = tl.load(slot_ptr + tok)
        dest = slot * KV_HEADS * DIM + kv_head * DIM
        cdt = k_cache_ptr.dtype.element_ty
        tl.store(k_cache_ptr + dest + d, to_cache(o1, inv_k, cdt, FP8))  # the rounded key, as torch stores it
        tl.store(k_cache_ptr + dest + HALF + d, to_cache(o2, inv_k, cdt, FP8))
        dd = tl.arange(0, DIM)
        v = tl.load(qkv_ptr + tok * stride_tok + (Q_HEADS + KV_HEADS + kv_head) * DIM + dd)
        tl.store(v_cache_ptr + dest + dd, to_cache(v, inv_v, cdt, FP8))


def rope_and_cache(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    table: torch.Tensor,
    slots: torch.Tensor,
    kv_cache: tuple[torch.Tensor, torch.Tensor],
    q_heads: int,
    kv_heads: int,
    dim: int,
    kv_scales: KVScales = UNIT_SCALES,
) -> None:
    """Rotate q and k of qkv [T, (q_heads + 2 kv_heads) * dim] in place and store k, v at their slots
    (an FP8 cache: quantised with the layer's scales, as replica/attention.py `write_kv` does)."""
    tokens = qkv.shape[0]
    inv_k, inv_v = kv_scales.inverse
    _rope_cache_kernel[(tokens, q_heads + kv_heads)](
        qkv, positions, table, slots, kv_cache[0], kv_cache[1], qkv.stride(0), inv_k, inv_v,
        Q_HEADS=q_heads, KV_HEADS=kv_heads, DIM=dim, HALF=dim // 2, FP8=is_fp8(kv_cache[0]),
    )  # fmt: skip


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    dt = out_ptr.dtype.element_ty
    g = tl.load(gate_up_ptr + row * 2 * inter + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gate_up_ptr + row * 2 * inter + inter + cols, mask=mask, other=0.0).to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
    tl.store(out_ptr + row * inter + cols, (act * u).to(dt), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    rows, width = gate_up.shape
    inter = width // 2
    out = torch.empty((rows, inter), dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(inter, block))](gate_up, out, inter, BLOCK=block)
    return out
