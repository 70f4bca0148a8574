"""Skinny GEMM against cuBLAS at decode row counts, as HBM bandwidth on the weights (CUDA only).

    python3 -m replica.gemm_bench --json OUT.json [--shapes llama-3.1-8b] [--rows 1,16,32,64]

For every weight of each model (qkv, o, gate_up, down, lm_head) and each row count M it times
F.linear (cuBLAS) and every candidate config of `skinny_linear`, and reports TB/s of weight bytes read.
Each timing is a CUDA graph of calls cycling through ≥ 1 GiB of distinct weight copies (at most 512
copies: ≥ 340 MB for the smallest matrix): the H200's L2 holds ~50 MB, and a decode step never finds
a layer's weights there (32 layers stream past), so reusing one copy would flatter small matrices.
The ceiling is a device-to-device copy (read + write bytes) and a read-only reduction over 2 GiB.
Last, the 8B's four layer GEMMs at M=32 over 32 layers' weights in one graph: what a decode step
sees, launch gaps included.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from replica import skinny_gemm as sk
from replica.presets import SHAPES

MODELS = ("llama-3.1-8b", "llama-3.2-1b", "smollm2-135m")
GIB = 1 << 30
START = time.perf_counter()


def weight_shapes(model: str) -> list[tuple[str, int, int]]:
    """(name, N, K) of the engine's fused weights: W is [N, K] and Y = X @ W^T."""
    s = SHAPES[model]
    head_dim = s.hidden_size // s.num_attention_heads
    q, kv = s.num_attention_heads * head_dim, s.num_key_value_heads * head_dim
    return [
        ("qkv_proj", q + 2 * kv, s.hidden_size),
        ("o_proj", s.hidden_size, q),
        ("gate_up_proj", 2 * s.intermediate_size, s.hidden_size),
        ("down_proj", s.hidden_size, s.intermediate_size),
        ("lm_head", s.vocab_size, s.hidden_size),
    ]


def _events_ms(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def ceiling(device: torch.device, nbytes: int = 2 * GIB) -> dict:
    """Copy bandwidth (bytes read + written) and read-only bandwidth (a sum) over nbytes."""
    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    copy_ms = _events_ms(lambda: dst.copy_(src), 10)
    read_ms = _events_ms(lambda: src.sum(), 10)
    return {
        "bytes": nbytes,
        "copy_tb_s": 2 * nbytes / copy_ms / 1e9,
        "read_tb_s": nbytes / read_ms / 1e9,
    }


def _tb_s(n: int, k: int, itemsize: int, us: float | None) -> float | None:
    return n * k * itemsize / us / 1e6 if us else None


def bench_shape(
    model: str, name: str, n: int, k: int, rows_list: list[int], dtype: torch.dtype
) -> list[dict]:
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    itemsize = torch.finfo(dtype).bits // 8
    weights = sk.rotated_weights(n, k, dtype, device, GIB)
    out = []
    for m in rows_list:
        x = torch.randn((m, k), dtype=dtype, device=device)
        ref = F.linear(x, weights[0])
        exact = (x.float() @ weights[0].float().T).sub_(ref.float()).abs_().max().item()
        cublas_us = sk.time_config(x, weights, None)
        timed, errors, err = {}, {}, 0.0
        for c in sk.fitting_candidates(m, n, k, sms):
            try:
                timed[c] = sk.time_config(x, weights, c)
                diff = (sk.skinny_linear(x, weights[0], config=c).float() - ref.float()).abs().max().item()
                err = max(err, diff)
            except Exception as e:  # e.g. a config that needs more shared memory than the SM has
                errors[c.name] = f"{type(e).__name__}: {str(e)[:160]}"
        best = min(timed, key=timed.__getitem__) if timed else None
        if best is not None:
            sk.set_config(m, n, k, dtype, best)  # the layer run below uses the winners
        default = sk.default_config(m, n, k, sms)
        row = {
            "model": model, "weight": name, "M": m, "N": n, "K": k, "weight_mb": n * k * itemsize / 1e6,
            "rotated_copies": weights.shape[0],
            "cublas_us": cublas_us, "cublas_tb_s": _tb_s(n, k, itemsize, cublas_us),
            "best_config": best.name if best else None,
            "best_us": timed.get(best), "best_tb_s": _tb_s(n, k, itemsize, timed.get(best)),
            "speedup": cublas_us / timed[best] if best else None,
            "default_config": default.name, "default_us": timed.get(default),
            "candidates_us": {c.name: t for c, t in sorted(timed.items(), key=lambda kv: kv[1])},
            "failed": errors,
            "max_abs_err_vs_cublas": err, "cublas_max_abs_err_vs_fp32": exact,
            "ref_max_abs": ref.abs().max().item(),
        }  # fmt: skip
        out.append(row)
        best_us = row["best_us"] or 0.0
        print(
            f"[{time.perf_counter() - START:5.1f}s] {model} {name} M={m}: cuBLAS {cublas_us:.1f} us, "
            f"skinny {best_us:.1f} us ({row['best_config']}), err {err:.3g}",
            file=sys.stderr,
        )
    del weights
    torch.cuda.empty_cache()
    return out


def bench_layer(dtype: torch.dtype, rows: int = 32, layers: int = 32) -> dict:
    """qkv, o, gate_up, down of the 8B over `layers` layers' weights, one graph per implementation.

    Inputs are contiguous [rows, K] tensors as in the engine (attention and SiLU×up write fresh ones);
    the kernels between the GEMMs are left out, so the difference is the GEMMs' own.
    """
    device = torch.device("cuda")
    shapes = weight_shapes("llama-3.1-8b")[:4]
    sk.warm_up([(rows, n, k) for _, n, k in shapes], dtype, device)  # no-op for shapes already tuned
    w = [torch.randn((layers, n, k), dtype=dtype, device=device).mul_(0.02) for _, n, k in shapes]
    xs = [torch.randn((rows, k), dtype=dtype, device=device) for _, _, k in shapes]

    def model_layers(lin) -> list[torch.Tensor]:
        outs = []
        for i in range(layers):
            outs = [lin(x, weight[i]) for x, weight in zip(xs, w, strict=True)]
        return outs

    diffs = zip(model_layers(sk.skinny_linear), model_layers(F.linear), strict=True)
    check = max((a.float() - b.float()).abs().max().item() for a, b in diffs)
    layer_bytes = sum(n * k for _, n, k in shapes) * (torch.finfo(dtype).bits // 8)
    result = {"rows": rows, "layers": layers, "layer_mb": layer_bytes / 1e6, "max_abs_diff": check}
    for label, lin in (("cublas", F.linear), ("skinny", sk.skinny_linear)):
        us = sk.time_graph(lambda _i, lin=lin: model_layers(lin), calls=1, replays=6) / layers
        result[f"{label}_us_per_layer"] = us
        result[f"{label}_tb_s"] = layer_bytes / us / 1e6
    result["configs"] = {name: sk.chosen_config(rows, n, k, dtype, device).name for name, n, k in shapes}
    result["speedup"] = result["cublas_us_per_layer"] / result["skinny_us_per_layer"]
    return result


def print_table(result: dict) -> None:
    """One line per (weight, M); %copy is the weight read rate over the device-copy rate."""
    copy = result["ceiling"]["copy_tb_s"]
    head = (
        f"{'model':13} {'weight':12} {'M':>3} {'N':>6} {'K':>5} | {'cuBLAS us':>9} {'TB/s':>5} {'%copy':>5}"
    )
    print(f"\n{head} | {'skinny us':>9} {'TB/s':>5} {'%copy':>5} {'best config':17} | {'x':>5} {'err':>7}")
    for r in result["shapes"]:
        cub, best = r["cublas_tb_s"], r["best_tb_s"] or 0.0
        print(
            f"{r['model']:13} {r['weight']:12} {r['M']:3d} {r['N']:6d} {r['K']:5d} | {r['cublas_us']:9.1f} "
            f"{cub:5.2f} {100 * cub / copy:5.0f} | {r['best_us'] or float('nan'):9.1f} {best:5.2f} "
            f"{100 * best / copy:5.0f} {r['best_config'] or '-':17} | {r['speedup'] or 0:5.2f} "
            f"{r['max_abs_err_vs_cublas']:7.3g}"
        )
    c = result["ceiling"]
    print(f"ceiling: device copy {c['copy_tb_s']:.2f} TB/s (read+write), read-only {c['read_tb_s']:.2f} TB/s")
    if "layer" in result:
        lay = result["layer"]
        print(
            f"8B layer at M={lay['rows']} over {lay['layers']} layers ({lay['layer_mb']:.0f} MB/layer): "
            f"cuBLAS {lay['cublas_us_per_layer']:.1f} us ({lay['cublas_tb_s']:.2f} TB/s), skinny "
            f"{lay['skinny_us_per_layer']:.1f} us ({lay['skinny_tb_s']:.2f} TB/s), x{lay['speedup']:.3f}"
        )
    print(f"wall {result['wall_s']:.1f} s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--shapes", default=",".join(MODELS), help=f"comma list of {MODELS}")
    p.add_argument("--rows", default="1,16,32,64")
    p.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    p.add_argument("--no-layer", action="store_true", help="skip the 32-layer 8B sequence")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gemm_bench needs CUDA")
    models = [m.strip() for m in args.shapes.split(",") if m.strip()]
    unknown = set(models) - set(MODELS)
    if unknown:
        raise SystemExit(f"unknown shapes {sorted(unknown)}; choose from {MODELS}")
    rows = [int(r) for r in args.rows.split(",")]
    if not all(0 < r <= sk.MAX_ROWS for r in rows):
        raise SystemExit(f"rows must be in 1..{sk.MAX_ROWS}")
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    device = torch.device("cuda")
    result = {
        "device": torch.cuda.get_device_name(device), "torch": torch.__version__,
        "triton": triton.__version__, "dtype": args.dtype, "ceiling": ceiling(device), "shapes": [],
    }  # fmt: skip
    for model in models:
        for name, n, k in weight_shapes(model):
            result["shapes"].extend(bench_shape(model, name, n, k, rows, dtype))
    if "llama-3.1-8b" in models and not args.no_layer:
        result["layer"] = bench_layer(dtype)
    # The winners as (row bucket, N, K) -> config: what a fixed table in skinny_gemm would hold.
    result["chosen"] = {f"{b},{n},{k}": c.name for (b, n, k, _), c in sorted(sk._CHOSEN.items(), key=str)}
    result["wall_s"] = time.perf_counter() - START
    args.json.write_text(json.dumps(result, indent=2))
    print_table(result)


if __name__ == "__main__":
    main()
