"""FP8 (e4m3) quantisation maths: the scales, the casts and the float32 reference of a product.

Weights are quantised per output channel (one float32 scale per row of W [N, K]) and activations per
token (one scale per row of x [M, K]), both symmetric with scale = amax / 448 (e4m3's largest
finite value), so every row uses the whole range and the largest magnitude lands on ±448 exactly.
The product of the two is then

    y[m, n] = s_x[m] · s_w[n] · Σ_k q_x[m, k] · q_w[n, k]

which is what the CUDA path computes (a unit-scale FP8 GEMM and the two scales applied to its
output, replica/fp8_linear.py) and what `reference_linear` computes here in float32. Pure torch: the
CPU tests check the maths and the model's quality with these functions.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
# A row of zeros has amax 0: its scale is floored so the division stays finite (the row quantises to
# zeros, and dequantises back to exact zeros, whatever the floor).
MIN_SCALE = 1e-12


def row_scales(x: torch.Tensor) -> torch.Tensor:
    """float32 [rows]: each row's amax / 448 (floored at MIN_SCALE)."""
    amax = x.detach().abs().amax(dim=-1).to(torch.float32)
    return (amax / FP8_MAX).clamp(min=MIN_SCALE)


def quantize_rows(x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x / scale per row, saturated at ±448 and rounded to e4m3 (round to nearest even)."""
    scaled = x.to(torch.float32) / scales.to(torch.float32).unsqueeze(-1)
    return scaled.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (e4m3 [N, K], float32 scales [N]): per output channel."""
    scales = row_scales(weight)
    return quantize_rows(weight, scales), scales


def quantize_activation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], float32 scales [M]): dynamic, per token (computed from x itself)."""
    scales = row_scales(x)
    return quantize_rows(x, scales), scales


def dequantize_rows(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 q · scale per row."""
    return q.to(torch.float32) * scales.to(torch.float32).unsqueeze(-1)


def reference_linear(
    x: torch.Tensor, weight_q: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The float32 result of the FP8 product: x quantised per token, both sides dequantised, then
    x @ W.T (+ bias). The CPU path of the FP8 module and the reference its CUDA path is tested against."""
    shape = x.shape
    rows = x.reshape(-1, shape[-1])
    xq, xs = quantize_activation(rows)
    y = dequantize_rows(xq, xs) @ dequantize_rows(weight_q, weight_scale).T
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.reshape(*shape[:-1], weight_q.shape[0])


def channel_scales(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A checkpoint's weight scale (per tensor: [] or [1]; per channel: [rows] or [rows, 1]) as
    float32 [rows]; ValueError for any other shape."""
    flat = scale.detach().to(torch.float32).reshape(-1)
    if flat.numel() == 1:
        return flat.expand(rows).clone()
    if flat.numel() == rows:
        return flat.clone()
    raise ValueError(
        f"a weight scale of shape {tuple(scale.shape)} fits neither one tensor nor {rows} channels"
    )
