"""CUDA kernels of the batched LoRA delta: a segmented shrink and expand over the step's tiles.

A step's adapter rows come grouped by slot into tiles of at most TILE_ROWS rows (replica/lora_step.py),
packed at the front of the tile table (count 0 past them). Per fused projection:

- shrink: P[split, p, :] = x[order[p]] · A[slot]ᵀ over one K-slice, for every tile row p. Programs
  (G, splits) walk the tiles G apart, so each program reads its slice of an adapter's A once per tile
  and the K-slices spread a small step over the device; float32 partials, no atomics;
- expand: out[order[p], cols] += (Σ_split P[split, p, part]) · B[slot, cols]ᵀ, for a column block that
  lies in one part (q, k or v; gate or up), so the part's R columns of P are the ones it reads.
  Programs (G, column blocks) walk the tiles likewise; each output element has one writer.

Rows without an adapter are in no tile and cost nothing; tiles past the step's own end the loops at
once, so a CUDA graph of a step size serves every mix of adapters. The grid depends only on the
step's size. Importable without Triton (the CPU never calls these).
"""

from __future__ import annotations

import math

import torch

from replica.lora_step import TILE_ROWS

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU image: the torch reference runs instead
    triton = None

# The shrink's K-slices: CHUNK_K columns each (at most MAX_SPLITS slices), in BLOCK_K steps. Few
# slices keep the expand's sum of partials short: the expand is on the step's critical path, the
# shrink runs beside the base projection (replica/lora_ops.py). Measured on the H200: 64- to
# 512-column steps cost the same (docs/bench/h200_lora_kernels_blockk_dec04.json).
BLOCK_K = 128
CHUNK_K = 512
MAX_SPLITS = 8
EXPAND_GROUPS = 32  # the expand's programs per column block, each walking the tiles this far apart: 8 made
# each walk 4 tiles deep with 32 adapters in a step (docs/bench/h200_lora_kernels_groups_dec04.json)


def _next_pow2(n: int) -> int:
    return 1 << max(4, (n - 1).bit_length())


def column_block(bounds: tuple[int, ...], widest: int = 128) -> int:
    """The widest power-of-two column block (16 to `widest`) that divides every inner part boundary,
    so that a block lies in one part (the output's end is masked)."""
    inner = bounds[1:-1]
    if not inner:
        return widest
    width = math.gcd(*inner)
    block = widest
    while block >= 16 and width % block:
        block //= 2
    if block < 16:
        raise ValueError(
            f"LoRA part sizes {bounds} are not multiples of 16: the CUDA kernels cannot tile them"
        )
    return block


def splits_for(k: int, chunk: int = CHUNK_K) -> int:
    """K-slices of the shrink: about `chunk` columns each, at most MAX_SPLITS. A program's loop over
    its slice waits a memory round trip per BLOCK_K step (the loop is not pipelined inside the walk
    over tiles), so short slices in few wide steps keep it latency-light."""
    return max(1, min(MAX_SPLITS, -(-k // chunk)))


def lora_shrink_expand(
    out, x, a, b, bounds, order, tiles, num_tiles: int, block_k: int = BLOCK_K, chunk: int = CHUNK_K,
    expand_groups: int = EXPAND_GROUPS,
) -> None:  # fmt: skip
    """out += the batched LoRA delta (see the module docstring), in place."""
    partials = shrink_buffer(x, a, chunk)
    lora_shrink(partials, x, a, order, tiles, num_tiles, block_k)
    lora_expand(out, partials, b, bounds, order, tiles, num_tiles, expand_groups)


def shrink_buffer(x: torch.Tensor, a: torch.Tensor, chunk: int = CHUNK_K) -> torch.Tensor:
    """The shrink's float32 partials [splits, tokens, parts · R] (allocate it on the stream that
    expands: the shrink may run on another, see replica/lora_ops.py)."""
    return torch.empty(
        splits_for(x.shape[1], chunk), x.shape[0], a.shape[1], dtype=torch.float32, device=x.device
    )


def lora_shrink(partials, x, a, order, tiles, num_tiles: int, block_k: int = BLOCK_K) -> None:
    """partials[split, p] = x[order[p]] · A[slot]ᵀ over the split's K-slice, for every tile row p."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    k, nr = x.shape[1], a.shape[1]
    splits = partials.shape[0]
    k_chunk = -(-k // splits)
    k_chunk = -(-k_chunk // block_k) * block_k  # whole block_k steps; the last slice is masked at K
    tile_slot, tile_start, tile_count = tiles
    _shrink_kernel[(min(num_tiles, 32), splits)](
        x, x.stride(0), a, a.stride(0), a.stride(1), order, tile_slot, tile_start, tile_count, num_tiles,
        partials, partials.stride(0), partials.stride(1), k, nr, k_chunk,
        BLOCK_M=TILE_ROWS, BLOCK_N=_next_pow2(nr), BLOCK_K=block_k, PRECISION=_precision(x),
    )  # fmt: skip


def lora_expand(out, partials, b, bounds, order, tiles, num_tiles: int, groups: int = EXPAND_GROUPS) -> None:
    """out[order[p], cols] += (Σ_split partials[split, p, part]) · B[slot, cols]ᵀ, in place."""
    n_out, rank = out.shape[1], b.shape[2]
    block_n = column_block(bounds)
    inner = [*bounds[1:-1], n_out, n_out][:2]  # part boundaries after the first (past the end: none)
    tile_slot, tile_start, tile_count = tiles
    _expand_kernel[(min(num_tiles, groups), -(-n_out // block_n))](
        partials, partials.stride(0), partials.stride(1), b, b.stride(0), b.stride(1), out, out.stride(0),
        order, tile_slot, tile_start, tile_count, num_tiles, inner[0], inner[1], n_out, rank,
        SPLITS=partials.shape[0], BLOCK_M=TILE_ROWS, BLOCK_N=block_n, BLOCK_R=_next_pow2(rank),
        PRECISION=_precision(out),
    )  # fmt: skip


def _precision(t: torch.Tensor) -> str:
    return "ieee" if t.dtype == torch.float32 else "tf32"


if triton is not None:

    @triton.jit
    def _shrink_kernel(
        x_ptr, stride_x, a_ptr, stride_a_slot, stride_a_row, order_ptr, tile_slot_ptr, tile_start_ptr,
        tile_count_ptr, num_tiles, part_ptr, stride_part_split, stride_part_row, K, NR, K_CHUNK,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
    ):  # fmt: skip
        split = tl.program_id(1)
        tile = tl.program_id(0)
        groups = tl.num_programs(0)
        m = tl.arange(0, BLOCK_M)
        n = tl.arange(0, BLOCK_N)
        n_ok = n < NR
        count = tl.load(tile_count_ptr + tile)
        while count > 0:
            slot = tl.load(tile_slot_ptr + tile).to(tl.int64)
            start = tl.load(tile_start_ptr + tile)
            m_ok = m < count
            rows = tl.load(order_ptr + start + m, mask=m_ok, other=0).to(tl.int64)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kk in range(0, K_CHUNK, BLOCK_K):
                k = split * K_CHUNK + kk + tl.arange(0, BLOCK_K)
                k_ok = k < K
                xt = tl.load(
                    x_ptr + rows[:, None] * stride_x + k[None, :],
                    mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0,
                )
                at = tl.load(
                    a_ptr + slot * stride_a_slot + n[None, :] * stride_a_row + k[:, None],
                    mask=k_ok[:, None] & n_ok[None, :], other=0.0,
                )  # fmt: skip
                acc += tl.dot(xt, at, input_precision=PRECISION)
            at_rows = (start + m).to(tl.int64)
            dest = part_ptr + split * stride_part_split + at_rows[:, None] * stride_part_row + n[None, :]
            tl.store(dest, acc, mask=m_ok[:, None] & n_ok[None, :])
            tile += groups
            count = tl.load(tile_count_ptr + tile, mask=tile < num_tiles, other=0)

    @triton.jit
    def _expand_kernel(
        part_ptr, stride_part_split, stride_part_row, b_ptr, stride_b_slot, stride_b_row, out_ptr, stride_out,
        order_ptr, tile_slot_ptr, tile_start_ptr, tile_count_ptr, num_tiles, bound1, bound2, N_OUT, RANK,
        SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
        PRECISION: tl.constexpr,
    ):  # fmt: skip
        tile = tl.program_id(0)
        groups = tl.num_programs(0)
        col0 = tl.program_id(1) * BLOCK_N
        cols = col0 + tl.arange(0, BLOCK_N)
        c_ok = cols < N_OUT
        part = (col0 >= bound1).to(tl.int32) + (col0 >= bound2).to(tl.int32)  # the block's part
        m = tl.arange(0, BLOCK_M)
        r = tl.arange(0, BLOCK_R)
        r_ok = r < RANK
        count = tl.load(tile_count_ptr + tile)
        while count > 0:
            slot = tl.load(tile_slot_ptr + tile).to(tl.int64)
            start = tl.load(tile_start_ptr + tile)
            m_ok = m < count
            rows = tl.load(order_ptr + start + m, mask=m_ok, other=0).to(tl.int64)
            at_rows = (start + m).to(tl.int64)
            s = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
            src = part_ptr + at_rows[:, None] * stride_part_row + part * RANK + r[None, :]
            for sp in tl.static_range(SPLITS):
                s += tl.load(src + sp * stride_part_split, mask=m_ok[:, None] & r_ok[None, :], other=0.0)
            bt = tl.load(
                b_ptr + slot * stride_b_slot + cols[None, :] * stride_b_row + r[:, None],
                mask=r_ok[:, None] & c_ok[None, :], other=0.0,
            )  # fmt: skip
            delta = tl.dot(s.to(bt.dtype), bt, input_precision=PRECISION)
            dest = out_ptr + rows[:, None] * stride_out + cols[None, :]
            mask = m_ok[:, None] & c_ok[None, :]
            old = tl.load(dest, mask=mask, other=0.0)
            tl.store(dest, (old.to(tl.float32) + delta).to(old.dtype), mask=mask)
            tile += groups
            count = tl.load(tile_count_ptr + tile, mask=tile < num_tiles, other=0)
