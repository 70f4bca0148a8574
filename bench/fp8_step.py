"""FP8 against bf16 on the 8B shape (random weights): decode steps and the projections alone.

    python -m bench.fp8_step --out $OUT/fp8_step.json [--model llama-3.1-8b] [--batches 1,16,64,256]

1. Linears alone: the four projections of every layer (each layer its own weights, so nothing is
   served from L2), one CUDA graph per batch: bf16 `nn.Linear`; FP8 as the engine runs it ("fp8":
   by rows, replica/fp8_kernels.py), with the unit-scale GEMM and the rescale kernel forced
   ("fp8_unit"), with rowwise `_scaled_mm` scales forced ("fp8_rowwise").
2. Decode step: the model's fused forward (Triton attention with rope, add+RMSNorm, SiLU×up, the
   engine's K-slice settings for bf16) over a paged cache of `--context` tokens per sequence, one
   CUDA graph replay per step, bf16 then FP8 weights. The sampler is not included.

Importable on the CPU (CUDA is touched only in `main`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

SHAPE_NAMES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def time_graph(fn, replays: int) -> float:
    """Milliseconds per replay of a CUDA graph of fn()."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()  # compile and settle allocations outside the capture
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


def layer_shapes(config) -> dict[str, tuple[int, int]]:
    """(K, N) of each projection of one layer of a transformers config."""
    head_dim = config.hidden_size // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    h, i = config.hidden_size, config.intermediate_size
    return {"qkv_proj": (h, q + 2 * kv), "o_proj": (q, h), "gate_up_proj": (h, 2 * i), "down_proj": (i, h)}


def linears_alone(config, batches: list[int], replays: int) -> list[dict]:
    import replica.fp8_kernels as kernels
    from replica.fp8_linear import FP8Linear

    shapes = layer_shapes(config)
    rows = []
    for variant in ("bf16", "fp8", "fp8_unit", "fp8_rowwise"):
        layers = []
        for _ in range(config.num_hidden_layers):
            for name in SHAPE_NAMES:
                k, n = shapes[name]
                w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
                if variant == "bf16":
                    layers.append((k, lambda x, w=w: torch.nn.functional.linear(x, w)))
                else:
                    module = FP8Linear(k, n, bias=False).cuda()
                    module.quantize_rows_from(w)
                    layers.append((k, module))
                del w
        for batch in batches:
            inputs = {k: torch.randn(batch, k, device="cuda", dtype=torch.bfloat16) for k, _ in layers}

            def run(layers=layers, inputs=inputs):
                for k, fn in layers:
                    fn(inputs[k])

            kernels.MODE = {"fp8_unit": "unit", "fp8_rowwise": "rowwise"}.get(variant, "auto")
            try:
                ms = time_graph(run, replays)
            finally:
                kernels.MODE = "auto"
            rows.append({"part": "linears", "variant": variant, "batch": batch, "ms": round(ms, 4)})
            print(rows[-1], flush=True)
        del layers
        torch.cuda.empty_cache()
    return rows


def decode_steps(model_name: str, batches: list[int], context: int, replays: int) -> list[dict]:
    from replica.attention_metadata import AttentionMetadata
    from replica.model_loader import load_model

    rows = []
    block = 16
    for quantization in (None, "fp8"):
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        started = time.perf_counter()
        loaded = load_model(model_name, torch.device("cuda"), torch.bfloat16, True, 0, quantization)
        load_s = time.perf_counter() - started
        model, cfg = loaded.model, loaded.config
        model.fused, model.k_slices, model.triton_gemms = True, 2, frozenset({"o"})  # the engine's defaults
        weights_gb = (torch.cuda.memory_allocated() - before) / 1e9
        for batch in batches:
            per_seq = -(-(context + 1) // block)
            blocks = batch * per_seq + 1
            shape = (blocks, block, cfg.num_key_value_heads, model.head_dim)
            caches = [
                tuple(torch.zeros(shape, dtype=torch.bfloat16, device="cuda") for _ in "kv")
                for _ in range(cfg.num_hidden_layers)
            ]
            tables = (torch.arange(batch * per_seq, device="cuda").view(batch, per_seq) + 1).int()
            lens = torch.full((batch,), context + 1, dtype=torch.int32, device="cuda")
            slots = (tables[:, context // block].long() * block + context % block).long()
            meta = AttentionMetadata(
                slot_mapping=slots, num_decode=batch, decode_block_tables=tables, decode_context_lens=lens,
                prefills=[], decode_backend="triton",
            )  # fmt: skip
            ids = torch.randint(100, cfg.vocab_size - 100, (batch,), device="cuda")
            positions = torch.full((batch,), context, dtype=torch.long, device="cuda")

            def step(model=model, ids=ids, positions=positions, caches=caches, meta=meta):
                model(ids, positions, caches, meta)

            with torch.inference_mode():
                ms = time_graph(step, replays)
            rows.append({
                "part": "decode_step", "variant": quantization or "bf16", "batch": batch, "context": context,
                "ms": round(ms, 4), "tok_s": round(batch / ms * 1000, 1), "weights_gb": round(weights_gb, 2),
                "load_s": round(load_s, 2),
            })  # fmt: skip
            print(rows[-1], flush=True)
            del caches, step, meta
            torch.cuda.empty_cache()
        del loaded, model
        torch.cuda.empty_cache()
    return rows


def speedups(rows: list[dict]) -> dict:
    """bf16 ms ÷ variant ms for every (part, batch)."""
    base = {(r["part"], r["batch"]): r["ms"] for r in rows if r["variant"] == "bf16"}
    out: dict[str, float] = {}
    for r in rows:
        if r["variant"] != "bf16":
            out[f"{r['part']}/{r['variant']}/b{r['batch']}"] = round(
                base[(r["part"], r["batch"])] / r["ms"], 3
            )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--context", type=int, default=512, help="cache tokens per sequence in decode steps")
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--skip-linears", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from transformers import LlamaConfig

    from replica.presets import SHAPES

    batches = [int(b) for b in args.batches.split(",")]
    config = LlamaConfig(**SHAPES[args.model].to_config_dict())
    rows = [] if args.skip_linears else linears_alone(config, batches, args.replays)
    rows += decode_steps(args.model, batches, args.context, args.replays)
    result = {
        "model": args.model, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "context": args.context, "rows": rows, "speedup_vs_bf16": speedups(rows),
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result["speedup_vs_bf16"], indent=2))


if __name__ == "__main__":
    main()
