"""Decode-step projections as a Triton GEMM that writes float32 K-slice partials.

`linear_partials_triton(x, w, parts)` computes x @ w.T as float32 partial products over `parts`
slices of K, [parts, rows, N], which the next residual-add + RMSNorm sums
(`replica.triton_fused.add_rmsnorm`), as `linear_partials` does with a batched cuBLAS GEMM. On the
8B shape's output projection at 32 rows it measured 13.66 µs per layer (with the norm) against
14.42 for the cuBLAS partials, and the decode step 27 µs shorter (docs/bench/HISTORY.md).

The operands are swapped: a program owns BLOCK_N rows of W (the matrix instruction's wide side) and
all of x's rows (at most 64, padded to 16/32/64), and streams its rows of W once. At decode batch
sizes the GEMM is a read of W.

Fusing SiLU × up into the down projection's operand load was measured and dropped: every variant
(operands either way round, register prefetch of the activation) ran 52.7-291 µs per layer against
36.7 for the SiLU kernel plus partials (docs/bench/h200_swiglu_down_variants.json; script in commit 8fdb472).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_ROWS = 64
BLOCK_N = 64
BLOCK_K = 128


@triton.jit(do_not_specialize=["M"])
def _partials_kernel(
    x_ptr, w_ptr, out_ptr, M, N, K_PART, stride_x, stride_w,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    part = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    # Rows past N or M read a valid row instead of a masked one, so the W stream keeps unmasked
    # vector loads; their results are dropped at the store.
    rows_w = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    rows_x = tl.minimum(offs_m, M - 1).to(tl.int64)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    k_start = part * K_PART
    for k in range(k_start, k_start + K_PART, BLOCK_K):
        kk = k + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rows_w[:, None] * stride_w + kk[None, :], eviction_policy="evict_first")
        x = tl.load(x_ptr + rows_x[None, :] * stride_x + kk[:, None], eviction_policy="evict_last")
        acc = tl.dot(w, x, acc)  # [BLOCK_N, BLOCK_M]: the transposed output tile
    out = out_ptr + part * M * N + offs_m[None, :] * N + offs_n[:, None]
    tl.store(out, acc, mask=(offs_n[:, None] < N) & (offs_m[None, :] < M))


def _block_m(rows: int) -> int:
    return 16 if rows <= 16 else 32 if rows <= 32 else 64


def supports(x: torch.Tensor, weight: torch.Tensor, parts: int) -> bool:
    """Whether these kernels take this launch: half-precision, decode-sized, K slices of whole tiles."""
    k = weight.shape[1]
    return (
        x.is_cuda
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and 0 < x.shape[0] <= MAX_ROWS
        and parts >= 1
        and k % (parts * BLOCK_K) == 0
        and weight.stride(1) == 1
        and x.stride(-1) == 1
    )


def linear_partials_triton(x: torch.Tensor, weight: torch.Tensor, parts: int) -> torch.Tensor:
    """x @ weight.T as float32 K-slice partials [parts, rows, N] (see `linear_partials`)."""
    if x.shape[1] != weight.shape[1] or not supports(x, weight, parts):
        raise ValueError("linear_partials_triton needs a half-precision CUDA launch of whole K tiles")
    rows = x.shape[0]
    n, k = weight.shape
    out = torch.empty((parts, rows, n), dtype=torch.float32, device=x.device)
    _partials_kernel[(triton.cdiv(n, BLOCK_N), parts)](
        x, weight, out, rows, n, k // parts, x.stride(0), weight.stride(0),
        BLOCK_M=_block_m(rows), BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=4, num_stages=4,
    )  # fmt: skip
    return out
