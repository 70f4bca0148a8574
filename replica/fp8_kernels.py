"""CUDA: the FP8 product of replica/fp8_linear.py on Hopper's FP8 tensor cores.

    quant_rows (Triton, one program per token): row amax → scale = amax / 448 → x / scale cast to e4m3
    torch._scaled_mm with unit scales (tensorwise): Σ_k q_x · q_w in float32, written in the model dtype
    rescale_rows (Triton, in place): y · s_x[m] · s_w[n] (+ bias)

On the H200 (Llama-3.1-8B's four projections × 32 layers in one CUDA graph, bench/fp8_step.py) the
unit-scale path measured 1.32, 1.33, 1.34 and 1.37× bf16 at 1, 16, 64 and 256 rows; `_scaled_mm`
with rowwise scales (per-token × per-channel inside the GEMM, fast accumulation) 0.86, 1.06, 1.10
and 1.45×. So launches of `ROWWISE_MIN_ROWS` rows or more take the rowwise GEMM (the quantisation
kernel still runs; no rescale kernel), smaller ones the unit-scale GEMM and the rescale, which is one
elementwise kernel over the output (the bias added there too). `MODE` forces either, for benches.
The unit-scale GEMM writes bf16 (an fp16 model's, float32): its output is rounded once more than a
rowwise GEMM's, a relative 2⁻⁹ at most. fp16 models always take the unit-scale path.

Triton ships with torch's CUDA builds; this module is imported only on a CUDA launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replica.fp8_quant import FP8_MAX, MIN_SCALE

QUANT_BLOCK = 1024  # columns per iteration of the quantisation loop
RESCALE_BLOCK = 1024
ROWWISE_MIN_ROWS = 256  # measured: rowwise wins at 256 rows, loses at 64 and below
MODE = "auto"  # "auto" (by rows, above), "unit" or "rowwise": benches force one


@triton.jit
def _quant_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, FP8_MAX: tl.constexpr, MIN_SCALE: tl.constexpr,
                       BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    src = x_ptr + row * stride_x
    amax = tl.zeros([BLOCK], tl.float32)
    for k in range(0, K, BLOCK):
        cols = k + tl.arange(0, BLOCK)
        x = tl.load(src + cols, mask=cols < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
    scale = tl.maximum(tl.max(amax, 0) / FP8_MAX, MIN_SCALE)
    tl.store(s_ptr + row, scale)
    for k in range(0, K, BLOCK):  # the row again, from L2: no second kernel, no float32 copy
        cols = k + tl.arange(0, BLOCK)
        x = tl.load(src + cols, mask=cols < K, other=0.0).to(tl.float32)
        q = tl.minimum(tl.maximum(x / scale, -FP8_MAX), FP8_MAX)
        tl.store(q_ptr + row * K + cols, q.to(q_ptr.dtype.element_ty), mask=cols < K)


def quant_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (unit column stride) -> (e4m3 [M, K], float32 scales [M]), per token, one launch."""
    rows, k = x.shape
    q = torch.empty((rows, k), dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows:
        _quant_rows_kernel[(rows,)](
            x, q, scales, k, x.stride(0), FP8_MAX=FP8_MAX, MIN_SCALE=MIN_SCALE, BLOCK=QUANT_BLOCK, num_warps=4
        )  # fmt: skip
    return q, scales


@triton.jit
def _rescale_kernel(y_ptr, out_ptr, sx_ptr, sw_ptr, bias_ptr, N, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    y = tl.load(y_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    y = y * tl.load(sx_ptr + row) * tl.load(sw_ptr + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        y += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * N + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rescale_rows(
    y: torch.Tensor,
    x_scale: torch.Tensor,
    w_scale: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
) -> torch.Tensor:
    """out = y [M, N] (contiguous) · x_scale[m] · w_scale[n] (+ bias[n]); out may be y itself."""
    rows, n = y.shape
    if rows:
        grid = (rows, triton.cdiv(n, RESCALE_BLOCK))
        has_bias = bias is not None
        _rescale_kernel[grid](
            y, out, x_scale, w_scale, bias if has_bias else w_scale, n, HAS_BIAS=has_bias, BLOCK=RESCALE_BLOCK
        )  # fmt: skip
    return out


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    unit_scale: torch.Tensor,
) -> torch.Tensor:
    """x [M, K] (bf16/fp16) @ dequantised weight [N, K] e4m3 .T (+ bias) -> [M, N] in x's dtype.
    No host sync: every scale stays on the device, so graphs capture it unchanged."""
    xq, x_scale = quant_rows(x)
    rowwise = MODE == "rowwise" or (MODE == "auto" and x.shape[0] >= ROWWISE_MIN_ROWS)
    if rowwise and x.dtype == torch.bfloat16:
        y = torch._scaled_mm(
            xq, weight.t(), scale_a=x_scale[:, None], scale_b=weight_scale[None, :], out_dtype=x.dtype,
            use_fast_accum=True,
        )  # fmt: skip
        return y if bias is None else y + bias
    # Unit-scale sums reach 448² · K: bf16 holds them, fp16 (largest 65504) does not, so an fp16
    # model's GEMM writes float32 and the rescale rounds once to fp16.
    wide = x.dtype if x.dtype == torch.bfloat16 else torch.float32
    y = torch._scaled_mm(xq, weight.t(), scale_a=unit_scale, scale_b=unit_scale, out_dtype=wide)
    out = y if wide == x.dtype else torch.empty(y.shape, dtype=x.dtype, device=y.device)
    return rescale_rows(y, x_scale, weight_scale, bias, out)
