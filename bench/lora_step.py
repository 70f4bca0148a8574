"""Multi-LoRA step cost: decode step time of the base model against 1, 8 and 32 distinct adapters.

    python -m bench.lora_step --out $OUT/lora_step.json

8B shape with random weights (bf16, CUDA graphs); rank-16 adapters on q, k, v, o, gate, up and down
(one random adapter directory, registered under as many names as adapters are asked for: distinct
slots, distinct weights reads). For each decode batch, `batch` greedy requests (64-token prompts,
ignore_eos) run together, adapters assigned round robin; the figure is the median device time
(CUDA events) of the graphed pure-decode steps at that batch. Side by side in one run:
- "base": an engine with LoRA off (the reference);
- "lora_on_no_adapter": the LoRA engine serving the base model only (rows with no adapter);
- "adapters_N": the LoRA engine with N distinct adapters in the batch.
Also the adapter's registration time (disk → checked, packed host image) and its slot load
(host → device, timed on the device). Writes JSON to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from replica import Engine, EngineConfig, SamplingParams
from replica.lora_adapter import ModuleShapes

MODEL = "llama-3.1-8b"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(out: Path, rank: int, seed: int = 0, shapes: ModuleShapes | None = None) -> Path:
    """A PEFT-format adapter with random bf16 A and B on all seven modules, of the base model
    `shapes` describes (an engine's: `engine.lora.shapes`); None: the 8B shape."""
    from safetensors.torch import save_file

    shapes = shapes or preset_shapes(MODEL)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(shapes.num_layers):
        for module in TARGETS:
            fan_in, fan_out = shapes.features[module]
            where = "self_attn" if module[0] in "qkvo" else "mlp"
            name = f"base_model.model.model.layers.{layer}.{where}.{module}"
            tensors[f"{name}.lora_A.weight"] = (
                torch.randn(rank, fan_in, generator=g) * fan_in**-0.5
            ).bfloat16()
            tensors[f"{name}.lora_B.weight"] = (torch.randn(fan_out, rank, generator=g) * 0.01).bfloat16()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = dict(peft_type="LORA", r=rank, lora_alpha=2 * rank, target_modules=list(TARGETS), bias="none")
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


def preset_shapes(model: str) -> ModuleShapes:
    """The adapter-facing shapes of a preset model (replica/presets.py), without loading it."""
    from transformers import LlamaConfig

    from replica.presets import SHAPES

    cfg = LlamaConfig(**SHAPES[model].to_config_dict())
    return ModuleShapes.of(cfg, cfg.hidden_size // cfg.num_attention_heads)


def adapter_names(count: int) -> list[str]:
    """The names `register_adapters` registers: a0 … a{count-1}."""
    return [f"a{i}" for i in range(count)]


def register_adapters(engine: Engine, path: Path, count: int, workers: int = 1) -> dict:
    """Register the adapter at `path` under `adapter_names(count)` (distinct names: distinct slots).
    a0 goes alone, so `register_s` is one adapter's registration (disk → checked, packed host image);
    the rest on `workers` threads (the registry is thread-safe), to spend less of a run on them."""
    started = time.perf_counter()
    engine.add_adapter("a0", str(path))
    first = time.perf_counter() - started
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda name: engine.add_adapter(name, str(path)), adapter_names(count)[1:]))
    total = time.perf_counter() - started
    return {
        "register_s": first,
        "register_s_each": total / count,
        "register_all_s": total,
        "workers": workers,
    }


async def decode_step_ms(engine: Engine, batch: int, names: list[str | None], tokens: int) -> dict:
    """Median device time of the graphed pure-decode steps of `batch` requests run together."""
    rng = np.random.default_rng(batch)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    before = engine.core.profiler.total_steps

    async def one(i: int) -> None:
        prompt = rng.integers(10, 100_000, size=64).tolist()
        async for _ in engine.generate(prompt, params, adapter=names[i % len(names)]):
            pass

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(batch)))
    wall = time.perf_counter() - started
    records = list(engine.core.profiler.records)[-(engine.core.profiler.total_steps - before) :]
    decode = [r for r in records if r.graphed and r.num_prefill_tokens == 0 and r.batch_size == batch]
    times = [r.compute_ms for r in decode[4:]]  # past the first few (the batch settling)
    return {
        "step_ms_p50": statistics.median(times) if times else None,
        "steps": len(times),
        "tokens_per_s": batch * tokens / wall,
    }


def _config(args, slots: int, adapters: tuple = ()) -> EngineConfig:
    return EngineConfig(
        model=MODEL, random_weights=True, device="cuda", mode="async", max_num_seqs=max(args.batches),
        max_num_batched_tokens=2048, context_cuda_graphs=False, lora_slots=slots,
        max_lora_rank=args.rank, lora_adapters=adapters,
    )  # fmt: skip


async def run(args) -> dict:
    result: dict = {
        "model": MODEL,
        "rank": args.rank,
        "tokens": args.tokens,
        "device": torch.cuda.get_device_name(),
    }
    base = Engine(_config(args, 0))
    await base.start()
    try:
        result["base"] = {str(b): await decode_step_ms(base, b, [None], args.tokens) for b in args.batches}
    finally:
        await base.stop()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_adapter(Path(tmp) / "adapter", args.rank)
        slots = max(args.adapters)
        engine = Engine(_config(args, slots))
        await engine.start()
        try:
            result["register_s_each"] = register_adapters(engine, path, slots)["register_s_each"]
            result["slot_bytes"] = engine.lora.layout.slot_bytes(engine.dtype)
            result["lora_on_no_adapter"] = {
                str(b): await decode_step_ms(engine, b, [None], args.tokens) for b in args.batches
            }
            for n in args.adapters:
                names = adapter_names(n)
                result[f"adapters_{n}"] = {
                    str(b): await decode_step_ms(engine, b, names, args.tokens) for b in args.batches
                }
            result["slot_load_ms"] = slot_load_ms(engine)
        finally:
            await engine.stop()
    for key, by_batch in list(result.items()):
        if key.startswith(("adapters_", "lora_on")):
            for b, figures in by_batch.items():
                ref = result["base"][b]["step_ms_p50"]
                if ref and figures["step_ms_p50"]:
                    figures["step_vs_base"] = figures["step_ms_p50"] / ref
    return result


def slot_load_ms(engine: Engine) -> float:
    """One slot's host → device copy, timed on the device (the engine is idle: nothing else runs);
    on the CPU, a plain copy timed by the clock. It writes a0's image into slot 0: call it after the
    runs, or where slot 0 holds a0's weights anyway (every name of `register_adapters` has them)."""
    slots = engine.core.scheduler.lora
    adapter = engine.lora.get("a0")
    if slots.pool.device.type != "cuda":
        started = time.perf_counter()
        slots.pool[0].copy_(adapter.packed)
        return (time.perf_counter() - started) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    slots.pool[0].copy_(adapter.packed, non_blocking=True)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--adapters", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
