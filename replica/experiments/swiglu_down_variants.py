"""Scratch: SwiGLU-prologue down projection variants against silu_mul + bmm partials (8B, 32 rows)."""

import json
import os

import torch
import triton
import triton.language as tl

from replica import triton_gemm
from replica.decode_attention_bench import time_graph
from replica.triton_fused import add_rmsnorm, linear_partials, silu_mul


@triton.jit
def _x_as_a(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    K_PART,
    INTER,
    stride_x,
    stride_w,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SWIGLU: tl.constexpr,
):
    pid_n = tl.program_id(0)
    part = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    rows_w = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    rows_x = tl.minimum(offs_m, M - 1).to(tl.int64)
    dt = w_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = part * K_PART
    for k in range(k_start, k_start + K_PART, BLOCK_K):
        kk = k + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rows_w[None, :] * stride_w + kk[:, None], eviction_policy="evict_first")
        xp = x_ptr + rows_x[:, None] * stride_x + kk[None, :]
        if SWIGLU:
            g = tl.load(xp).to(tl.float32)
            u = tl.load(xp + INTER).to(tl.float32)
            x = ((g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * u).to(dt)
        else:
            x = tl.load(xp)
        acc = tl.dot(x, w, acc)
    out = out_ptr + part * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(out, acc, mask=(offs_n[None, :] < N) & (offs_m[:, None] < M))


@triton.jit
def _prefetch(
    x_ptr,
    w_ptr,
    out_ptr,
    M,
    N,
    K_PART,
    INTER,
    stride_x,
    stride_w,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SWIGLU: tl.constexpr,
):
    pid_n = tl.program_id(0)
    part = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    rows_w = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    rows_x = tl.minimum(offs_m, M - 1).to(tl.int64)
    dt = w_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    k_start = part * K_PART
    kk = k_start + tl.arange(0, BLOCK_K)
    xp = x_ptr + rows_x[None, :] * stride_x + kk[:, None]
    g_next = tl.load(xp)
    u_next = tl.load(xp + INTER)
    for k in range(k_start, k_start + K_PART, BLOCK_K):
        kk = k + tl.arange(0, BLOCK_K)
        g = g_next.to(tl.float32)
        u = u_next.to(tl.float32)
        nk = kk + BLOCK_K
        ok = nk < k_start + K_PART
        xp = x_ptr + rows_x[None, :] * stride_x + nk[:, None]
        g_next = tl.load(xp, mask=ok[:, None], other=0.0)
        u_next = tl.load(xp + INTER, mask=ok[:, None], other=0.0)
        w = tl.load(w_ptr + rows_w[:, None] * stride_w + kk[None, :], eviction_policy="evict_first")
        x = ((g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * u).to(dt)
        acc = tl.dot(w, x, acc)
    out = out_ptr + part * M * N + offs_m[None, :] * N + offs_n[:, None]
    tl.store(out, acc, mask=(offs_n[:, None] < N) & (offs_m[None, :] < M))


def launch(kernel, x, w, parts, swiglu, bm, bn, bk, warps, stages):
    rows = x.shape[0]
    n, k = w.shape
    out = torch.empty((parts, rows, n), dtype=torch.float32, device=x.device)
    kernel[(triton.cdiv(n, bn), parts)](
        x,
        w,
        out,
        rows,
        n,
        k // parts,
        k,
        x.stride(0),
        w.stride(0),
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        SWIGLU=swiglu,
        num_warps=warps,
        num_stages=stages,
    )
    return out


def main():
    rows, K, N, L = 32, 14336, 4096, 32
    ws = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K**-0.5 for _ in range(L)]
    gu = torch.randn(rows, 2 * K, device="cuda", dtype=torch.bfloat16)
    norm = torch.ones(N, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(rows, N, device="cuda", dtype=torch.bfloat16)
    ref = linear_partials(silu_mul(gu), ws[0], 2).sum(0)
    variants = {"bmm2_silu": lambda w: linear_partials(silu_mul(gu), w, 2), "triton2_plain_on_act": None}
    act = silu_mul(gu)
    variants["triton2_plain_on_act"] = lambda w: triton_gemm.linear_partials_triton(act, w, 2)
    variants["silu+triton2_plain"] = lambda w: triton_gemm.linear_partials_triton(silu_mul(gu), w, 2)
    variants["swapped_swiglu2"] = lambda w: triton_gemm.down_partials(gu, w, 2)
    for bm in (32, 64):
        for bn in (64, 128):
            for warps, stages in ((4, 4), (4, 3), (8, 3)):
                variants[f"x_as_a_m{bm}_n{bn}_w{warps}_s{stages}"] = (
                    lambda w, bm=bm, bn=bn, warps=warps, stages=stages: launch(
                        _x_as_a, gu, w, 2, True, bm, bn, 128, warps, stages
                    )
                )
    for bk in (64, 128):
        for stages in (3, 4, 5):
            variants[f"prefetch_k{bk}_s{stages}"] = lambda w, bk=bk, stages=stages: launch(
                _prefetch, gu, w, 2, True, 32, 64, bk, 4, stages
            )
    results = {}
    for name, fn in variants.items():
        try:
            got = fn(ws[0]).sum(0)
            err = ((got - ref).norm() / ref.norm()).item()
            us = time_graph(lambda fn=fn: [add_rmsnorm(fn(w), res, norm, 1e-5) for w in ws], 20) * 1000 / L
            results[name] = {"us_per_layer": us, "rel_err": err}
        except Exception as e:
            results[name] = {"error": str(e)[:200]}
        print(f"{name:34} {results[name]}", flush=True)
    json.dump(results, open(os.path.join(os.environ.get("OUT", "."), "swiglu_variants.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
