"""A decode step's K-heavy projections on the GPU: cuBLAS's own split-K against K-slice partials.

At decode batch sizes the output projection and the MLP's down projection are skinny GEMMs that
cuBLAS splits along K, adding the slices in a separate reduce kernel. The alternative measured here
computes the slices as one batched GEMM with float32 outputs and lets the next fused residual-add +
RMSNorm add them (`replica.triton_fused.linear_partials`). Each variant runs as in a decode step:
GEMM then add_rmsnorm, once per layer with the layer's own weights, captured in one CUDA graph.

    python -m replica.decode_gemm_bench --rows 32 --parts 2,4,8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from replica.decode_attention_bench import time_graph
from replica.triton_fused import add_rmsnorm, linear_partials

# Llama-3.1-8B, (K, N). The first two feed add_rmsnorm (which can add partials); the other two feed
# rotary/cache and SiLU kernels, so only their bare GEMM is timed, to see what slicing K would buy.
SHAPES = {
    "o_proj": (4096, 4096),
    "down_proj": (14336, 4096),
    "qkv_proj": (4096, 6144),
    "gate_up_proj": (4096, 28672),
}
NORMED = ("o_proj", "down_proj")


def _gemm(x: torch.Tensor, w: torch.Tensor, parts: int) -> torch.Tensor:
    return torch.nn.functional.linear(x, w) if parts == 1 else linear_partials(x, w, parts)


def shape_rows(args: argparse.Namespace, name: str, k: int, n: int) -> list[dict]:
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(args.layers)]
    norm = torch.ones(n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(args.rows, k, device="cuda", dtype=torch.bfloat16)
    pristine = torch.randn(args.rows, n, device="cuda", dtype=torch.bfloat16)
    residual = pristine.clone()  # the timed steps add into it
    reference = add_rmsnorm(_gemm(x, weights[0], 1), pristine.clone(), norm, 1e-5).float()
    rows = []
    for parts in [1, *(p for p in args.parts if k % p == 0)]:
        got = add_rmsnorm(_gemm(x, weights[0], parts), pristine.clone(), norm, 1e-5).float()
        err = ((got - reference).norm() / reference.norm()).item()

        def step(parts=parts):
            for w in weights:
                y = _gemm(x, w, parts)
                if name in NORMED:
                    add_rmsnorm(y, residual, norm, 1e-5)

        us = time_graph(step, args.replays) * 1000 / args.layers
        what = "gemm+add_rmsnorm" if name in NORMED else "gemm"
        rows.append(
            {"shape": name, "timed": what, "k": k, "n": n, "parts": parts, "us_per_layer": us, "rel_err": err}
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=32, help="the decode batch")
    p.add_argument("--parts", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 8])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows = [r for name, (k, n) in SHAPES.items() for r in shape_rows(args, name, k, n)]
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name(),
        "rows": rows,
    }
    result["args"] = vars(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(f"{'shape':>12} {'timed':>16} {'parts':>5} {'us/layer':>9} {'err':>8}   (parts 1: cuBLAS alone)")
    for r in rows:
        us, err = r["us_per_layer"], r["rel_err"]
        print(f"{r['shape']:>12} {r['timed']:>16} {r['parts']:>5} {us:>9.2f} {err:>8.1e}")


if __name__ == "__main__":
    main()
