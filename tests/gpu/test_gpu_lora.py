"""Multi-LoRA on the GPU (skipped without CUDA): the Triton kernels equal the torch reference in bf16,
and engines with adapters equal the reference through graphed decode steps and mixed steps.

Run on the GPU machine: python -m pytest tests/gpu/test_gpu_lora.py -q --confcutdir=tests/gpu

The device image has no peft: adapters are written here in PEFT's format (adapter_config.json and
adapter_model.safetensors under PEFT's tensor names), and the reference is transformers' model with
each adapter merged into its weights (W + s·B·A), in float32: mathematically the unmerged sum.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from replica import Engine, EngineConfig, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

VOCAB = 49152
ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MAX_TOKENS = 16


def write_adapter(hf_model, out: Path, targets=ALL, rank: int = 8, alpha: float = 8.0, seed: int = 0) -> dict:
    """A PEFT-format adapter of `hf_model` with random A and B; its (layer, module) -> (A, s·B)."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    tensors, merged = {}, {}
    for name, module in hf_model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in targets or ".layers." not in f".{name}":
            continue
        fan_out, fan_in = module.weight.shape
        a = torch.randn(rank, fan_in, generator=g) * fan_in**-0.5
        b = torch.randn(fan_out, rank, generator=g) * rank**-0.5
        tensors[f"base_model.model.{name}.lora_A.weight"] = a
        tensors[f"base_model.model.{name}.lora_B.weight"] = b
        merged[name] = (a, b * (alpha / rank))
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = dict(peft_type="LORA", r=rank, lora_alpha=alpha, target_modules=list(targets), bias="none")
    (out / "adapter_config.json").write_text(json.dumps(config))
    return merged


def merged_reference(model_dir: Path, merged: dict | None):
    from tests.replica.checkpoints import hf_from_dir

    model = hf_from_dir(model_dir)
    with torch.no_grad():
        for name, (a, b) in (merged or {}).items():
            model.get_submodule(name).weight += b @ a
    return model.cuda()


def test_kernels_equal_the_torch_reference_in_bf16():
    from replica.lora_ops import lora_reference
    from replica.lora_step import fill_lora, max_tiles
    from replica.lora_triton import lora_shrink_expand

    g = torch.Generator(device="cuda").manual_seed(0)
    rng = np.random.default_rng(0)
    slots, rank, k = 12, 16, 4096
    bounds = (0, 4096, 5120, 6144)  # q, k, v of the 8B shape
    a = (torch.randn(slots, 3 * rank, k, generator=g, device="cuda") * k**-0.5).bfloat16()
    b = (torch.randn(slots, bounds[-1], rank, generator=g, device="cuda") * rank**-0.5).bfloat16()
    for tokens in (1, 7, 32, 128, 600):
        rows = rng.integers(-1, slots, size=tokens)
        items = [type("I", (), {"seq": type("S", (), {"lora_slot": int(s)}), "num_new": 1}) for s in rows]
        plan = type("P", (), {"items": items, "num_tokens": tokens})
        n_tiles = max_tiles(tokens, slots)
        arrays = {"lora_slot": np.zeros(tokens, np.int64), "lora_order": np.zeros(tokens, np.int32)}
        arrays |= {f"lora_tile_{n}": np.zeros(n_tiles, np.int32) for n in ("slot", "start", "count")}
        fill_lora(plan, arrays, tokens)
        dev = {name: torch.from_numpy(v).cuda() for name, v in arrays.items()}
        x = torch.randn(tokens, k, generator=g, device="cuda").bfloat16()
        base = torch.randn(tokens, bounds[-1], generator=g, device="cuda").bfloat16()
        ref = base.float()
        lora_reference(ref, x.float(), a.float(), b.float(), bounds, dev["lora_slot"])
        out = base.clone()
        tiles = tuple(dev[f"lora_tile_{n}"] for n in ("slot", "start", "count"))
        lora_shrink_expand(out, x, a, b, bounds, dev["lora_order"], tiles, n_tiles)
        none = torch.from_numpy(rows < 0).cuda()
        assert torch.equal(out[none], base[none])
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        assert err < 2e-2, (tokens, err)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from tests.replica.checkpoints import random_hf_model, save_checkpoint, tiny_config

    root = tmp_path_factory.mktemp("lora-gpu")
    kind = tiny_config("llama-tied", VOCAB)
    model = random_hf_model(kind, seed=11)
    from bench.write_checkpoint import checkpoint_tokenizer

    model_dir = save_checkpoint(model, kind, root / "model", checkpoint_tokenizer(VOCAB))
    merged = {
        "a": write_adapter(model, root / "a", ALL, 8, 8.0, seed=1),
        "b": write_adapter(model, root / "b", ("q_proj", "v_proj", "down_proj"), 16, 16.0, seed=2),
        "c": write_adapter(model, root / "c", ("k_proj", "o_proj", "up_proj"), 4, 8.0, seed=3),
        "d": write_adapter(model, root / "d", ALL, 16, 4.0, seed=4),
    }
    return model_dir, root, merged


def _plan(count: int, seed: int = 0) -> list[tuple[list[int], str | None]]:
    rng = np.random.default_rng(seed)
    names = [None, "a", "b", "c", "d"]
    return [
        (rng.integers(3, VOCAB, size=int(rng.integers(5, 120))).tolist(), names[i % 5]) for i in range(count)
    ]


async def _serve(config: EngineConfig, plan) -> tuple[list[list[int]], tuple[int, int]]:
    """Each request's tokens, and the runner's (graph, mixed-graph) replays read before the stop."""
    engine = Engine(config)
    await engine.start()

    async def one(i, prompt, adapter):
        await asyncio.sleep(0.01 * (i % 4))
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
        return [t async for out in engine.generate(prompt, params, adapter=adapter) for t in out.token_ids]

    try:
        outs = await asyncio.gather(*(one(i, p, a) for i, (p, a) in enumerate(plan)))
        replays = (engine.core.runner.graph_replays, engine.core.runner.mixed_replays)
    finally:
        await engine.stop()
    return outs, replays


def _config(model_dir: Path, root: Path, **kwargs) -> EngineConfig:
    adapters = tuple((n, str(root / n)) for n in "abcd")
    return EngineConfig(model=str(model_dir), device="cuda", lora_slots=4, lora_adapters=adapters, **kwargs)


def test_float32_graphed_engine_equals_merged_reference(setup):
    """Float32 (decode graphs, eager prefill): every request equals transformers with its adapter."""
    from tests.replica.checkpoints import hf_greedy_many

    model_dir, root, merged = setup
    plan = _plan(20)
    outs, (replays, _) = asyncio.run(_serve(_config(model_dir, root, dtype="float32", mode="async"), plan))
    assert replays > 0
    for name in (None, "a", "b", "c", "d"):
        mine = [(i, p) for i, (p, a) in enumerate(plan) if a == name]
        ref_model = merged_reference(model_dir, merged[name] if name else None)
        refs = hf_greedy_many(ref_model, [p for _, p in mine], [MAX_TOKENS] * len(mine), [])
        for (i, _), ref in zip(mine, refs, strict=True):
            assert outs[i] == ref, (i, name)


def test_bf16_graphs_equal_eager_with_mixed_adapters(setup):
    """bf16: decode graphs and mixed-step graphs over rows of four adapters and of none give what the
    same engine gives eagerly (the same kernels, other step shapes: near-ties may part a few)."""
    model_dir, root, _ = setup
    plan = _plan(30, seed=1)
    graphed, (replays, mixed) = asyncio.run(_serve(_config(model_dir, root, mode="async"), plan))
    eager, _ = asyncio.run(_serve(_config(model_dir, root, mode="async", cuda_graphs=False), plan))
    assert replays > 0 and mixed > 0
    same = sum(g == e for g, e in zip(graphed, eager, strict=True))
    assert same >= 0.9 * len(plan), f"{same} of {len(plan)} agree"
