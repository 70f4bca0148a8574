"""The LoRA delta's kernels alone, at the 8B shape: the expand's programs per column block (8, 32, 64:
each walks the step's tiles that far apart), beside the base projections the delta adds to.

    python -m bench.lora_kernels --out $OUT/lora_kernels.json

For each token count and number of distinct adapters in the step (0: LoRA on, no row with an
adapter), one CUDA graph runs the four fused projections' deltas (qkv, o, gate_up, down) of all 32
layers, each layer with its own pool of slots (rank 16, as many slots as the largest adapter count),
so that nothing is served from L2 that a real step would read from memory. The figure is the median
replay time (CUDA events) over 20 replays, and its ratio to the graph of the base projections alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from replica.lora_step import fill_lora, max_tiles
from replica.lora_triton import lora_shrink_expand

HIDDEN, INTER, LAYERS = 4096, 14336, 32
MODULES = {  # name: (in, output part bounds)
    "qkv": (HIDDEN, (0, 4096, 5120, 6144)),
    "o": (HIDDEN, (0, HIDDEN)),
    "gate_up": (HIDDEN, (0, INTER, 2 * INTER)),
    "down": (INTER, (0, HIDDEN)),
}
PATHS = {f"g{n}": partial(lora_shrink_expand, expand_groups=n) for n in (8, 32, 64)}


def _graph_ms(body, replays: int = 20) -> float:
    body()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _tiles(tokens: int, adapters: int, slots: int, device) -> tuple:
    rows = [i % adapters if adapters else -1 for i in range(tokens)]
    items = [SimpleNamespace(seq=SimpleNamespace(lora_slot=s), num_new=1) for s in rows]
    n = max_tiles(tokens, slots)
    arrays = {"lora_slot": np.zeros(tokens, np.int64), "lora_order": np.zeros(tokens, np.int32)}
    arrays |= {f"lora_tile_{k}": np.zeros(n, np.int32) for k in ("slot", "start", "count")}
    fill_lora(SimpleNamespace(items=items, num_tokens=tokens), arrays, tokens)
    order = torch.from_numpy(arrays["lora_order"]).to(device)
    tiles = tuple(torch.from_numpy(arrays[f"lora_tile_{k}"]).to(device) for k in ("slot", "start", "count"))
    return order, tiles, n


def _base(layers: list[dict], xs: dict, outs: dict) -> None:
    for layer in layers:
        for name, (w, _, _, _) in layer.items():
            torch.matmul(xs[name], w.t(), out=outs[name])


def _delta(layers: list[dict], xs: dict, outs: dict, kernel, order, tiles, n_tiles: int) -> None:
    for layer in layers:
        for name, (_, a, b, bounds) in layer.items():
            kernel(outs[name], xs[name], a, b, bounds, order, tiles, n_tiles)


def run(token_counts: list[int], adapter_counts: list[int], rank: int) -> dict:
    device = torch.device("cuda")
    dtype = torch.bfloat16
    slots = max(max(adapter_counts), 1)
    g = torch.Generator(device=device).manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layer = {}
        for name, (k, bounds) in MODULES.items():
            parts, n = len(bounds) - 1, bounds[-1]
            w = torch.randn(n, k, device=device, dtype=dtype, generator=g) * k**-0.5
            a = torch.randn(slots, parts * rank, k, device=device, dtype=dtype, generator=g) * k**-0.5
            b = torch.randn(slots, n, rank, device=device, dtype=dtype, generator=g) * 0.01
            layer[name] = (w, a, b, bounds)
        layers.append(layer)
    results: dict = {"rank": rank, "slots": slots, "layers": LAYERS, "device": torch.cuda.get_device_name()}
    for tokens in token_counts:
        shapes = MODULES.items()
        xs = {n: torch.randn(tokens, k, device=device, dtype=dtype, generator=g) for n, (k, _) in shapes}
        outs = {n: torch.zeros(tokens, b[-1], device=device, dtype=dtype) for n, (_, b) in MODULES.items()}
        row = {"base_ms": _graph_ms(lambda xs=xs, outs=outs: _base(layers, xs, outs))}
        for adapters in adapter_counts:
            order, tiles, n_tiles = _tiles(tokens, adapters, slots, device)
            for path, kernel in PATHS.items():
                step = (kernel, order, tiles, n_tiles)
                ms = _graph_ms(lambda xs=xs, outs=outs, step=step: _delta(layers, xs, outs, *step))
                row[f"{path}/{adapters}"] = {"ms": ms, "vs_base": ms / row["base_ms"]}
        results[str(tokens)] = row
        print(tokens, json.dumps(row), flush=True)
    return results


def profile(tokens: int, adapters: int, rank: int) -> list[dict]:
    """Each kernel's own device time (torch.profiler, eager launches), per module: what the graph's
    figure is made of besides the gaps between kernels."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    device = torch.device("cuda")
    slots = max(adapters, 1)
    order, tiles, n_tiles = _tiles(tokens, adapters, slots, device)
    rows = []
    for name, (k, bounds) in MODULES.items():
        x = torch.randn(tokens, k, device=device, dtype=torch.bfloat16)
        out = torch.zeros(tokens, bounds[-1], device=device, dtype=torch.bfloat16)
        a = torch.randn(slots, (len(bounds) - 1) * rank, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(slots, bounds[-1], rank, device=device, dtype=torch.bfloat16)
        lora_shrink_expand(out, x, a, b, bounds, order, tiles, n_tiles)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(50):
                lora_shrink_expand(out, x, a, b, bounds, order, tiles, n_tiles)
            torch.cuda.synchronize()
        for event in prof.key_averages():
            if event.device_time_total > 0:
                us = event.device_time_total / max(event.count, 1)
                rows.append({"module": name, "kernel": event.key, "us": us, "count": event.count})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--adapters", type=int, nargs="+", default=[0, 1, 8, 32])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--profile", action="store_true", help="per-kernel device times instead")
    args = parser.parse_args()
    if args.profile:
        rows = [{"tokens": t, "adapters": n, **row} for t in args.tokens for n in args.adapters
                for row in profile(t, n, args.rank)]  # fmt: skip
        args.out.write_text(json.dumps(rows, indent=1))
        for row in rows:
            where = f"{row['tokens']:5d} {row['adapters']:3d} {row['module']:8s}"
            print(f"{where} {row['us']:8.2f} us  {row['kernel'][:60]}")
        return
    results = run(args.tokens, args.adapters, args.rank)
    args.out.write_text(json.dumps(results, indent=1))
    print(
        "tokens  adapters  " + "  ".join(f"{p:>7}" for p in PATHS) + "   (ms added per step; base linears ms)"
    )
    for tokens in args.tokens:
        row = results[str(tokens)]
        for adapters in args.adapters:
            cells = "  ".join(f"{row[f'{p}/{adapters}']['ms']:7.3f}" for p in PATHS)
            print(f"{tokens:6d}  {adapters:8d}  {cells}   ({row['base_ms']:.3f})")


if __name__ == "__main__":
    main()
