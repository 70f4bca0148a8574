"""A decode step's K-heavy projections on the GPU: cuBLAS's own split-K against K-slice partials.

At decode batch sizes the output projection and the MLP's down projection are skinny GEMMs that
cuBLAS splits along K, adding the slices in a separate reduce kernel. The alternative measured here
computes the slices as one batched GEMM with float32 outputs and lets the next fused residual-add +
RMSNorm add them (`replica.triton_fused.linear_partials`). Each variant runs as in a decode step:
GEMM then add_rmsnorm, once per layer with the layer's own weights, captured in one CUDA graph.
Three kernels per shape: cuBLAS alone (parts 1), K-slice partials as a batched cuBLAS GEMM (`bmm`),
and the Triton partials kernel (`triton`, replica/triton_gemm.py). Last, the greedy pick after the
LM head: float32 cast plus torch's argmax against replica/triton_greedy.py.

    python -m bench.decode_gemm --rows 32 --parts 2,4,8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bench.decode_attention import time_graph
from replica.triton_fused import add_rmsnorm, linear_partials, silu_mul
from replica.triton_gemm import MAX_ROWS, linear_partials_triton
from replica.triton_greedy import greedy_tokens

# Llama-3.1-8B, (K, N). The first two feed add_rmsnorm (which can add partials); the other two feed
# rotary/cache and SiLU kernels, so only their bare GEMM is timed, to see what slicing K would buy.
SHAPES = {
    "o_proj": (4096, 4096),
    "down_proj": (14336, 4096),
    "qkv_proj": (4096, 6144),
    "gate_up_proj": (4096, 28672),
}
NORMED = ("o_proj", "down_proj")


def _variants(name: str, parts_list: list[int], k: int, rows: int) -> list[tuple[str, int, Callable]]:
    """(kernel, parts, fn(x, w)) to time for one shape. The down projection's x is gate_up [rows, 2K]:
    every variant includes its SiLU × up kernel, as in the model."""
    act = silu_mul if name == "down_proj" else (lambda x: x)
    out: list[tuple[str, int, Callable]] = [("cublas", 1, lambda x, w: F.linear(act(x), w))]
    for parts in (p for p in parts_list if p > 1 and k % p == 0):
        out.append(("bmm", parts, lambda x, w, parts=parts: linear_partials(act(x), w, parts)))
    if name in NORMED and rows <= MAX_ROWS:
        for parts in (p for p in parts_list if k % (p * 128) == 0):
            out.append(("triton", parts, lambda x, w, parts=parts: linear_partials_triton(act(x), w, parts)))
    return out


def shape_rows(args: argparse.Namespace, name: str, k: int, n: int) -> list[dict]:
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5 for _ in range(args.layers)]
    norm = torch.ones(n, device="cuda", dtype=torch.bfloat16)
    width = 2 * k if name == "down_proj" else k
    x = torch.randn(args.rows, width, device="cuda", dtype=torch.bfloat16)
    pristine = torch.randn(args.rows, n, device="cuda", dtype=torch.bfloat16)
    residual = pristine.clone()  # the timed steps add into it
    variants = _variants(name, sorted({1, *args.parts}), k, args.rows)
    reference = add_rmsnorm(variants[0][2](x, weights[0]), pristine.clone(), norm, 1e-5).float()
    rows = []
    for kernel, parts, fn in variants:
        got = add_rmsnorm(fn(x, weights[0]), pristine.clone(), norm, 1e-5).float()
        err = ((got - reference).norm() / reference.norm()).item()

        def step(fn=fn):
            for w in weights:
                y = fn(x, w)
                if name in NORMED:
                    add_rmsnorm(y, residual, norm, 1e-5)

        us = time_graph(step, args.replays) * 1000 / args.layers
        what = "gemm+add_rmsnorm" if name in NORMED else "gemm"
        what = "silu+" + what if name == "down_proj" else what
        rows.append(
            {"shape": name, "timed": what, "kernel": kernel, "k": k, "n": n, "parts": parts,
             "us_per_layer": us, "rel_err": err}
        )  # fmt: skip
    return rows


def greedy_rows(args: argparse.Namespace, hidden: int = 4096, vocab: int = 128256) -> list[dict]:
    """The LM head and the greedy pick of one decode step, each way (the 8B shape's vocabulary);
    `us_per_layer` is per LM head + pick, `rel_err` the share of rows whose tokens differ."""
    head = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16) * hidden**-0.5
    x = torch.randn(args.rows, hidden, device="cuda", dtype=torch.bfloat16)
    ways = {
        "torch_float_argmax": lambda: F.linear(x, head).float().argmax(dim=-1),
        "triton_greedy": lambda: greedy_tokens(F.linear(x, head)),
    }
    differ = (ways["torch_float_argmax"]() != ways["triton_greedy"]()).float().mean().item()
    rows = []
    for kernel, fn in ways.items():
        us = time_graph(lambda fn=fn: [fn() for _ in range(args.layers)], args.replays) * 1000 / args.layers
        rows.append({"shape": "lm_head", "timed": "gemm+greedy", "kernel": kernel, "k": hidden, "n": vocab,
                     "parts": 1, "us_per_layer": us, "rel_err": differ})  # fmt: skip
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
    rows += greedy_rows(args)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name(),
        "rows": rows,
    }
    result["args"] = vars(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(f"{'shape':>12} {'timed':>21} {'kernel':>7} {'parts':>5} {'us/layer':>9} {'err':>8}")
    for r in rows:
        us, err = r["us_per_layer"], r["rel_err"]
        print(f"{r['shape']:>12} {r['timed']:>21} {r['kernel']:>7} {r['parts']:>5} {us:>9.2f} {err:>8.1e}")


if __name__ == "__main__":
    main()
