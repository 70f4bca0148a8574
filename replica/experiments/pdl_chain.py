"""Scratch: does programmatic dependent launch hide the ramp/tail of a chain of skinny GEMMs?

A decode layer's four GEMMs (8B shape, 32 rows) x 32 layers, each reading the previous output, in one
CUDA graph: cuBLAS, Triton without PDL, Triton with PDL (trigger at start, first W tile before wait).
"""

import json
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from replica.decode_attention_bench import time_graph


@triton.jit
def _gemm(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_x,
    stride_w,
    stride_y,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    rows_w = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    rows_x = tl.minimum(offs_m, M - 1).to(tl.int64)
    if PDL:
        gdc_launch_dependents()
    kk = tl.arange(0, BLOCK_K)
    w0 = tl.load(w_ptr + rows_w[:, None] * stride_w + kk[None, :], eviction_policy="evict_first")
    if PREFETCH:  # touch the next tiles so they come from L2 after the wait
        for j in tl.static_range(1, 4):
            tl.load(
                w_ptr + rows_w[:, None] * stride_w + (kk + j * BLOCK_K)[None, :], eviction_policy="evict_last"
            )
    if PDL:
        gdc_wait()
    x0 = tl.load(x_ptr + rows_x[None, :] * stride_x + kk[:, None])
    acc = tl.dot(w0, x0)
    for k in range(BLOCK_K, K, BLOCK_K):
        kk = k + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rows_w[:, None] * stride_w + kk[None, :], eviction_policy="evict_first")
        x = tl.load(x_ptr + rows_x[None, :] * stride_x + kk[:, None], eviction_policy="evict_last")
        acc = tl.dot(w, x, acc)
    y = y_ptr + offs_m[None, :] * stride_y + offs_n[:, None]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=(offs_n[:, None] < N) & (offs_m[None, :] < M))


def gemm(x, w, y, pdl, bn, prefetch=False):
    m, k = x.shape[0], w.shape[1]
    n = w.shape[0]
    _gemm[(triton.cdiv(n, bn),)](
        x,
        w,
        y,
        m,
        n,
        k,
        x.stride(0),
        w.stride(0),
        y.stride(0),
        BLOCK_M=32,
        BLOCK_N=bn,
        BLOCK_K=128,
        PDL=pdl,
        PREFETCH=prefetch,
        num_warps=4,
        num_stages=4,
        launch_pdl=pdl,
    )


SHAPES = [
    ("qkv", 4096, 6144, 32),
    ("o", 4096, 4096, 32),
    ("gate_up", 4096, 28672, 64),
    ("down", 14336, 4096, 32),
]


def main():
    L, rows = 32, 32
    weights = [
        [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _, k, n, _ in SHAPES]
        for _ in range(L)
    ]
    outs = [torch.empty(rows, n, device="cuda", dtype=torch.bfloat16) for _, _, n, _ in SHAPES]
    x0 = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
    total_mb = sum(w.numel() * 2 for layer in weights for w in layer) / 1e6

    def chain(kind):
        def run():
            x = x0
            for layer in weights:
                for (name, k, n, bn), w, y in zip(SHAPES, layer, outs):
                    src = x[:, :k]
                    if kind == "cublas":
                        torch.mm(src, w.t(), out=y)
                    else:
                        gemm(src, w, y, pdl=kind.startswith("pdl"), bn=bn, prefetch=kind.endswith("prefetch"))
                    x = y

        return run

    ref = None
    results = {}
    for kind in ("cublas", "triton", "pdl", "pdl_prefetch", "triton", "pdl", "cublas"):
        chain(kind)()
        torch.cuda.synchronize()
        got = outs[-1].float().clone()
        if kind == "triton" and ref is None:
            ref = got
        err = ((got - ref).norm() / ref.norm()).item() if ref is not None else None
        us = time_graph(chain(kind), 10) * 1000 / L
        key = kind if kind not in results else kind + "_again"
        results[key] = {"us_per_layer": us, "tb_s": total_mb / L / us, "rel_err_vs_triton": err}
        print(f"{key:18} {us:8.2f} us/layer {total_mb / L / us:6.3f} TB/s err {err}", flush=True)
    json.dump(results, open(os.path.join(os.environ.get("OUT", "."), "pdl_chain.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
