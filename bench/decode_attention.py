"""Paged decode attention alone on the GPU: the kernel's launch settings against the memory's speed.

One CUDA graph calls the kernel once per layer, each layer with its own cache (so nothing stays in
L2 between calls), the blocks of each sequence scattered over the cache as a serving replica leaves
them. It reports microseconds per call and the cache bytes read per second for each setting, next to
a device-to-device copy's rate (read + write, as the engine benchmark's roofline counts it), and
checks every setting's output against the single-split kernel.

    python -m bench.decode_attention --contexts 256,512,768 --json out.json
    python -m bench.decode_attention --kv-dtype fp8 --widen fp16,bf16 --batch 216 --contexts 4096 --layers 8

With `--kv-dtype fp8` the caches are float8_e4m3fn (the FP8 KV cache, unit scales) and `--widen`
sweeps the dtype the kernel widens them to for the products; the bytes read count one per element.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import torch

from bench.roofline import copy_bandwidth_gbps
from replica.triton_decode import default_splits, paged_decode_attention

WIDEN = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _cache(layers: int, batch: int, ctx: int, kv_heads: int, dim: int, block_size: int, dtype: torch.dtype):
    per_seq = -(-ctx // block_size)
    blocks = batch * per_seq + 1
    caches = [
        (
            torch.randn(blocks, block_size, kv_heads, dim, device="cuda", dtype=torch.bfloat16).to(dtype),
            torch.randn(blocks, block_size, kv_heads, dim, device="cuda", dtype=torch.bfloat16).to(dtype),
        )
        for _ in range(layers)
    ]
    order = torch.randperm(blocks - 1, device="cuda") + 1  # block 0 stays reserved, as in the engine
    tables = order[: batch * per_seq].view(batch, per_seq).to(torch.int32)
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    return caches, tables, lens


def time_graph(fn, replays: int) -> float:
    """Milliseconds per replay of a graph of fn()."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()  # compile and warm outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / replays


def context_rows(args: argparse.Namespace, ctx: int, settings: list[dict]) -> list[dict]:
    dtype = torch.float8_e4m3fn if args.kv_dtype == "fp8" else torch.bfloat16
    caches, tables, lens = _cache(
        args.layers, args.batch, ctx, args.kv_heads, args.dim, args.block_size, dtype
    )
    q = torch.randn(args.batch, args.heads, args.dim, device="cuda", dtype=torch.bfloat16)
    kv_bytes = 2 * args.batch * ctx * args.kv_heads * args.dim * caches[0][0].element_size()
    scale = args.dim**-0.5
    reference = paged_decode_attention(q, *caches[0], tables, lens, scale, splits=1).float()
    rows = []
    for setting in settings:
        launch = {k: v for k, v in setting.items() if k != "widen"}
        if args.kv_dtype == "fp8":
            launch["fp8_widen"] = WIDEN[setting["widen"]]

        def all_layers(launch=launch):
            for k, v in caches:
                paged_decode_attention(q, k, v, tables, lens, scale, **launch)

        out = paged_decode_attention(q, *caches[0], tables, lens, scale, **launch).float()
        err = ((out - reference).norm() / reference.norm()).item()
        us = time_graph(all_layers, args.replays) * 1000 / args.layers
        rows.append(
            {"context": ctx, **setting, "us_per_call": us, "tb_s": kv_bytes / us / 1e6, "rel_err": err}
        )
    return rows


def run(args: argparse.Namespace) -> dict:
    settings = [
        dict(splits=s, tokens_per_iter=t, num_warps=w, num_stages=st, widen=d)
        for s, t, w, st, d in itertools.product(args.splits, args.tokens, args.warps, args.stages, args.widen)
    ]
    rows = []
    for ctx in args.contexts:
        rows += context_rows(args, ctx, settings)
        torch.cuda.empty_cache()
    auto = default_splits(args.batch, args.kv_heads, args.max_model_len, 128)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name(),
        "args": vars(args),
        "copy_tb_s": copy_bandwidth_gbps() / 1000,
        "default_splits": auto,
        "rows": rows,
    }


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=4096, help="for the default split count")
    p.add_argument("--contexts", type=_ints, default=[256, 512, 768])
    p.add_argument("--splits", type=_ints, default=[1, 2, 4, 8, 16])
    p.add_argument("--tokens", type=_ints, default=[32, 64])
    p.add_argument("--warps", type=_ints, default=[4])
    p.add_argument("--stages", type=_ints, default=[2, 3])
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--kv-dtype", choices=("bf16", "fp8"), default="bf16")
    p.add_argument("--widen", type=lambda t: t.split(","), default=["fp16"], help="fp8: fp16,bf16")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    result = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    splits = result["default_splits"]
    print(f"copy {result['copy_tb_s']:.2f} TB/s; default splits at batch {args.batch}: {splits}")
    heads = ("ctx", "widen", "splits", "tok", "warps", "stages", "us/call", "TB/s", "err")
    print(" ".join(f"{h:>{w}}" for h, w in zip(heads, (5, 5, 6, 4, 5, 6, 8, 6, 8), strict=True)))
    for r in result["rows"]:
        widen = r["widen"] if args.kv_dtype == "fp8" else "-"
        print(
            f"{r['context']:>5} {widen:>5} {r['splits']:>6} {r['tokens_per_iter']:>4} {r['num_warps']:>5} "
            f"{r['num_stages']:>6} {r['us_per_call']:>8.2f} {r['tb_s']:>6.2f} {r['rel_err']:>8.1e}"
        )


if __name__ == "__main__":
    main()
