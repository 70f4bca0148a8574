"""PEFT LoRA adapter directories written directly (adapter_config.json + adapter_model.safetensors),
with random non-zero A and B, for tests that need an adapter of a model without loading the model."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def module_shapes(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int) -> dict:
    """(in, out) features of each target module of a Llama-family layer."""
    q, kv = heads * head_dim, kv_heads * head_dim
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, intermediate),
        "up_proj": (hidden, intermediate),
        "down_proj": (intermediate, hidden),
    }


SMOLLM2_135M = {"layers": 30, "shapes": module_shapes(576, 1536, 9, 3, 64)}


def write_lora(
    path: Path,
    layers: int,
    shapes: dict,
    rank: int = 8,
    alpha: int = 16,
    modules: tuple[str, ...] = MODULES,
    seed: int = 0,
    std: float = 0.05,
) -> Path:
    """An adapter at ``path`` as PEFT saves one (tensor names under base_model.model.model.layers)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for module in modules:
            fan_in, fan_out = shapes[module]
            group = "self_attn" if module in MODULES[:4] else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{group}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, fan_in, generator=generator) * std
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(fan_out, rank, generator=generator) * std
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": list(modules),
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "fan_in_fan_out": False,
        "base_model_name_or_path": None,
    }
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path
