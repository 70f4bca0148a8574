"""Skinny GEMM for decode steps: Y[M, N] = X[M, K] @ W[N, K]^T for M ≤ 64, bf16/fp16, fp32 accumulation.

At decode batch sizes a linear layer is a stream over W: every step reads all weights once, and the
matmul's FLOPs are small beside that. cuBLAS picks tiles of 64-128 W rows, which leaves SMs idle on
narrow layers (8B qkv: 96 tiles on 132 SMs) or splits K with a second reduce kernel (o_proj, down_proj).

The kernel swaps the operands: a program owns BLOCK_N rows of W (the MMA's M side) and all the rows of
X (the MMA's N side, padded to 16/32/64), and streams its W rows through a `num_stages`-deep pipeline.
Small BLOCK_N gives many programs, so every SM keeps loads in flight. SPLIT_K > 1 stays one kernel:
each program writes an fp32 partial, bumps a per-tile counter, and the tile's last program sums the
partials, writes Y and resets the counter to zero for the next call (and the next graph replay).

Configs come from `warm_up` (timed over rotated weight copies so reads come from HBM, not L2; Triton's
autotuner would time one L2-resident copy and would tune inside graph capture) or from a heuristic.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

MAX_ROWS = 64
DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class SkinnyConfig:
    block_n: int
    block_k: int
    split_k: int = 1
    stages: int = 4
    warps: int = 4

    @property
    def name(self) -> str:
        return f"n{self.block_n}_k{self.block_k}_s{self.split_k}_p{self.stages}_w{self.warps}"


# What the benchmark searches and warm_up times (each compiles in well under a second). Small
# BLOCK_N: many programs; large: X re-read from L2 fewer times; split-K: for N ≤ ~8k.
CANDIDATES = (
    SkinnyConfig(16, 256, 1, 4, 4),
    SkinnyConfig(32, 128, 1, 6, 4),
    SkinnyConfig(32, 256, 1, 4, 4),
    SkinnyConfig(64, 128, 1, 4, 4),
    SkinnyConfig(64, 256, 1, 3, 4),
    SkinnyConfig(128, 64, 1, 6, 8),
    SkinnyConfig(128, 128, 1, 3, 8),
    SkinnyConfig(32, 256, 2, 4, 4),
    SkinnyConfig(64, 128, 2, 4, 4),
    SkinnyConfig(64, 128, 4, 4, 4),
)


@triton.jit(do_not_specialize=["M", "K_ITERS"])
def _skinny_kernel(
    x_ptr, w_ptr, y_ptr, ws_ptr, lock_ptr, M, N, K, K_ITERS, stride_xm, stride_wn, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    # Rows past N or M load a valid row instead of a masked one: the W stream keeps unmasked vector
    # loads; those results are dropped at the store.
    rows_w = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    rows_x = tl.minimum(offs_m, M - 1)
    # Each split covers K_ITERS whole blocks; blocks past K (uneven K or split) load zeros.
    k_start = pid_k * K_ITERS * BLOCK_K
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for i in range(0, K_ITERS):
        kk = k_start + i * BLOCK_K + tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + rows_w[:, None] * stride_wn + kk[None, :]
        x_ptrs = x_ptr + rows_x[None, :] * stride_xm + kk[:, None]
        if EVEN_K:
            w = tl.load(w_ptrs, eviction_policy="evict_first")  # read once: keep X and partials in L2
            x = tl.load(x_ptrs, eviction_policy="evict_last")
        else:  # both sides zero past K: 0 * garbage could be NaN
            w = tl.load(w_ptrs, mask=kk[None, :] < K, other=0.0, eviction_policy="evict_first")
            x = tl.load(x_ptrs, mask=kk[:, None] < K, other=0.0, eviction_policy="evict_last")
        acc = tl.dot(w, x, acc)  # [BLOCK_N, BLOCK_M]: Y^T's tile
    n_ok = offs_n < N
    y_ptrs = y_ptr + offs_m[None, :] * stride_ym + offs_n[:, None]
    y_mask = n_ok[:, None] & (offs_m[None, :] < M)
    if SPLIT_K == 1:
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=y_mask)
    else:
        part = ws_ptr + offs_m[None, :] * N + offs_n[:, None]  # workspace [SPLIT_K, BLOCK_M, N] fp32
        tl.store(part + pid_k * BLOCK_M * N, acc, mask=n_ok[:, None])
        tl.debug_barrier()  # every thread's partial is written before the counter moves
        arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:  # the tile's last program: the others' partials are visible
            total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                total += tl.load(part + s * BLOCK_M * N, mask=n_ok[:, None], other=0.0, cache_modifier=".cg")
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=y_mask)
            tl.atomic_xchg(lock_ptr + pid_n, 0)


def row_bucket(rows: int) -> int:
    """The padded row count (MMA width) a launch uses: 16, 32 or 64."""
    return 16 if rows <= 16 else 32 if rows <= 32 else 64


@functools.lru_cache(maxsize=8)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def default_config(rows: int, n: int, k: int, sms: int = 132) -> SkinnyConfig:
    """Untuned choice: the largest tile that still gives each SM a couple of programs."""
    if triton.cdiv(n, 64) >= 2 * sms:
        return SkinnyConfig(64, 128, 1, 4, 4)
    if triton.cdiv(n, 32) >= sms:
        return SkinnyConfig(32, 256, 1, 4, 4)
    split = max(1, min(4, round(2 * sms / triton.cdiv(n, 64)), k // 512))
    return SkinnyConfig(64, 128, 1 << (split.bit_length() - 1), 4, 4)


_CHOSEN: dict[tuple[int, int, int, torch.dtype], SkinnyConfig] = {}
# Split-K partials and counters per (device, N, split). Never freed or replaced: captured graphs keep
# their addresses. Launches on one stream run one after another, so layers of one shape can share.
_SPLIT_BUFFERS: dict[tuple[torch.device, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def set_config(rows: int, n: int, k: int, dtype: torch.dtype, config: SkinnyConfig) -> None:
    _CHOSEN[(row_bucket(rows), n, k, dtype)] = config


def chosen_config(rows: int, n: int, k: int, dtype: torch.dtype, device: torch.device) -> SkinnyConfig:
    found = _CHOSEN.get((row_bucket(rows), n, k, dtype))
    return found if found is not None else default_config(rows, n, k, _sm_count(device))


def _split_buffers(device: torch.device, n: int, split: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    key = (device, n, split)
    if key not in _SPLIT_BUFFERS:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None  # allocating here would tie the buffer to this graph's pool: go without split
        ws = torch.empty((split, MAX_ROWS, n), dtype=torch.float32, device=device)
        _SPLIT_BUFFERS[key] = (ws, torch.zeros(triton.cdiv(n, 16), dtype=torch.int32, device=device))
    return _SPLIT_BUFFERS[key]


def uses_kernel(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether skinny_linear runs the Triton kernel (else it calls F.linear)."""
    if not (x.is_cuda and weight.is_cuda and x.device == weight.device):
        return False
    if x.dtype not in DTYPES or weight.dtype != x.dtype or weight.dim() != 2 or x.dim() < 1:
        return False
    k = weight.shape[1]
    if x.shape[-1] != k or k == 0 or weight.stride(1) != 1 or weight.shape[0] == 0:
        return False
    return 0 < x.numel() // k <= MAX_ROWS


def launch(x2: torch.Tensor, weight: torch.Tensor, config: SkinnyConfig) -> torch.Tensor:
    """Y = x2 @ weight^T for a 2-D x2 with unit column stride; no checks (runs under TRITON_INTERPRET)."""
    rows, k = x2.shape
    n = weight.shape[0]
    buffers = _split_buffers(x2.device, n, config.split_k) if config.split_k > 1 else None
    if buffers is None:
        config = replace(config, split_k=1)
        buffers = (x2, x2)  # unused by the SPLIT_K == 1 kernel
    y = torch.empty((rows, n), dtype=x2.dtype, device=x2.device)
    k_iters = triton.cdiv(triton.cdiv(k, config.block_k), config.split_k)
    grid = (triton.cdiv(n, config.block_n), config.split_k)
    _skinny_kernel[grid](
        x2, weight, y, buffers[0], buffers[1], rows, n, k, k_iters,
        x2.stride(0), weight.stride(0), y.stride(0),
        BLOCK_M=row_bucket(rows), BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=config.split_k,
        EVEN_K=k == k_iters * config.block_k * config.split_k,
        num_stages=config.stages, num_warps=config.warps,
    )  # fmt: skip
    return y


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, *, config: SkinnyConfig | None = None
) -> torch.Tensor:
    """F.linear(x, weight) without bias; the Triton kernel for ≤ 64 rows of bf16/fp16 on CUDA."""
    if not uses_kernel(x, weight):
        return F.linear(x, weight)
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    config = config or chosen_config(rows, n, k, x.dtype, x.device)
    return launch(x2, weight, config).view(*x.shape[:-1], n)


# ---- timing and ahead-of-time tuning ------------------------------------------------------------------
def rotated_weights(
    n: int, k: int, dtype: torch.dtype, device: torch.device, rotate_bytes: int, max_copies: int = 512
) -> torch.Tensor:
    """[copies, n, k] with copies * n * k * itemsize ≥ rotate_bytes: cycling through them misses L2."""
    itemsize = torch.finfo(dtype).bits // 8
    copies = max(1, min(max_copies, math.ceil(rotate_bytes / (n * k * itemsize))))
    return torch.randn((copies, n, k), dtype=dtype, device=device) * 0.02


def time_graph(fn: Callable[[int], object], calls: int, replays: int = 8) -> float:
    """Median µs per call of fn(0..calls-1) captured in one CUDA graph (launch gaps as in a decode step)."""
    fn(0)  # compile and allocate outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    del graph
    return sorted(times)[len(times) // 2]


def time_config(x: torch.Tensor, weights: torch.Tensor, config: SkinnyConfig | None) -> float:
    """µs per call over the rotated weights; config None times F.linear (cuBLAS)."""
    copies = weights.shape[0]
    if config is None:
        return time_graph(lambda i: F.linear(x, weights[i % copies]), max(copies, 32))
    return time_graph(lambda i: skinny_linear(x, weights[i % copies], config=config), max(copies, 32))


def fitting_candidates(rows: int, n: int, k: int, sms: int = 132) -> list[SkinnyConfig]:
    """CANDIDATES minus what cannot pay off here: K blocks longer than K, split-K with many tiles."""
    keep = []
    for c in CANDIDATES:
        if c.block_k > max(64, triton.next_power_of_2(k)) or c.block_n > max(16, triton.next_power_of_2(n)):
            continue
        if c.split_k > 1 and (
            triton.cdiv(n, c.block_n) * c.split_k > 4 * sms or k < 2 * c.split_k * c.block_k
        ):
            continue
        keep.append(c)
    return keep


def warm_up(
    shapes: Iterable[tuple[int, int, int]],
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cuda",
    tune: bool = True,
    rotate_bytes: int = 1 << 29,
) -> dict[tuple[int, int, int], SkinnyConfig]:
    """Before graph capture: pick (tune=True: time the candidates) and compile a config per (rows, N, K).

    Compiles, split-K buffers and timing all happen here, so later captures only launch.
    """
    device = torch.device(device)
    picked = {}
    for rows, n, k in shapes:
        key = (row_bucket(rows), n, k, dtype)
        x = torch.randn((rows, k), dtype=dtype, device=device)
        if key not in _CHOSEN and tune:
            _CHOSEN[key] = _tune(x, rotated_weights(n, k, dtype, device, rotate_bytes))
        config = chosen_config(rows, n, k, dtype, device)
        _CHOSEN[key] = config
        skinny_linear(x, torch.empty((n, k), dtype=dtype, device=device), config=config)  # compile
        picked[(rows, n, k)] = config
    torch.cuda.synchronize(device)
    return picked


def _tune(x: torch.Tensor, weights: torch.Tensor) -> SkinnyConfig:
    """The fastest candidate over rotated weights; the heuristic's pick when none runs."""
    rows, (n, k) = x.shape[0], weights.shape[1:]
    sms = _sm_count(x.device)
    timed = {}
    for c in fitting_candidates(rows, n, k, sms):
        try:
            timed[c] = time_config(x, weights, c)
        except Exception:  # a config that does not fit this GPU (shared memory) is skipped
            continue
    return min(timed, key=timed.__getitem__, default=default_config(rows, n, k, sms))
