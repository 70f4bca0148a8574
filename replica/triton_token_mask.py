"""CUDA: set the logits of tokens a grammar disallows to -inf, from packed int32 masks, in place.

One program per (sample row, BLOCK ids). A row whose `mask_rows` entry is -1 (unconstrained) loads
nothing and stores nothing, so a CUDA graph runs the kernel for every sample step and unconstrained
rows pay only an idle program. Constrained rows read their BLOCK / 32 words once and write -inf only
where a bit is clear: the logits themselves are never read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _token_mask_kernel(
    logits_ptr, mask_ptr, mask_rows_ptr, vocab, logits_stride, mask_stride, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    mask_row = tl.load(mask_rows_ptr + row).to(tl.int64)
    active = mask_row >= 0
    ids = block * BLOCK + tl.arange(0, BLOCK)
    inside = (ids < vocab) & active
    words = tl.load(mask_ptr + tl.maximum(mask_row, 0) * mask_stride + ids // 32, mask=inside, other=-1)
    banned = ((words >> (ids % 32)) & 1) == 0
    tl.store(logits_ptr + row * logits_stride + ids, float("-inf"), mask=inside & banned)


def mask_logits(logits: torch.Tensor, mask_rows: torch.Tensor, masks: torch.Tensor) -> None:
    """logits [rows, vocab] float32 (CUDA, last dim contiguous); mask_rows [rows] int32; masks
    [max rows, words] int32. Fixed launch shape for a given `logits` shape (graph-safe)."""
    rows, vocab = logits.shape
    if rows == 0:
        return
    grid = (rows, triton.cdiv(vocab, BLOCK))
    _token_mask_kernel[grid](logits, masks, mask_rows, vocab, logits.stride(0), masks.stride(0), BLOCK=BLOCK)
