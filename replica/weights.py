"""Fill our Llama module from Hugging Face checkpoint tensors, or with random values."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from replica.llama import LlamaForCausalLM

# HF name -> (our name, index of the shard inside a fused matrix)
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_FUSED_NAME = re.compile(r"\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.weight$")


def checkpoint_tensors(model_dir: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a safetensors checkpoint (single file or sharded with an index)."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = [p.name for p in sorted(model_dir.glob("*.safetensors"))]
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {model_dir}")
    for name in files:
        with safe_open(str(model_dir / name), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                yield key, f.get_tensor(key)


def load_checkpoint(model: LlamaForCausalLM, model_dir: Path) -> None:
    """Copy a checkpoint into `model`, fusing q/k/v and gate/up; every parameter must be written."""
    params = dict(model.named_parameters())
    written: set[str] = set()
    for hf_name, tensor in checkpoint_tensors(model_dir):
        name = hf_name.removeprefix("model.")
        if "rotary_emb" in name:
            continue
        match = _FUSED_NAME.search(name)
        if match:
            fused, shard = _FUSED[match.group(1)]
            name = name[: match.start()] + f".{fused}.weight"
            _copy_shard(params[name], tensor, shard, model, fused)
            written.add(f"{name}#{shard}")
            continue
        if name not in params:
            raise KeyError(f"checkpoint tensor {hf_name} has no place in the model")
        with torch.no_grad():
            params[name].copy_(tensor)
        written.add(name)
    _check_complete(model, written)


def _shard_sizes(model: LlamaForCausalLM, fused: str) -> list[int]:
    cfg = model.config
    if fused == "gate_up_proj":
        return [cfg.intermediate_size] * 2
    q = cfg.num_attention_heads * model.head_dim
    kv = cfg.num_key_value_heads * model.head_dim
    return [q, kv, kv]


def _copy_shard(param: torch.Tensor, tensor: torch.Tensor, shard: int, model: LlamaForCausalLM, fused: str):
    sizes = _shard_sizes(model, fused)
    start = sum(sizes[:shard])
    with torch.no_grad():
        param[start : start + sizes[shard]].copy_(tensor)


def _check_complete(model: LlamaForCausalLM, written: set[str]) -> None:
    missing = []
    for name, _ in model.named_parameters():
        if name.endswith(("qkv_proj.weight", "gate_up_proj.weight")):
            shards = 3 if "qkv" in name else 2
            if any(f"{name}#{i}" not in written for i in range(shards)):
                missing.append(name)
        elif name not in written:
            missing.append(name)
    if missing:
        raise KeyError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")


# Output and embedding matrices get a larger scale, so logits spread like a trained model's and
# greedy comparisons between implementations are not decided by near-ties between random logits.
OUTPUT_STD = 0.2


def init_random(model: LlamaForCausalLM, seed: int) -> None:
    """Random weights for throughput work: the step time does not depend on the values."""
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    std = getattr(model.config, "initializer_range", 0.02)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                param.fill_(1.0)
            elif name in ("embed_tokens.weight", "lm_head.weight"):
                param.normal_(0.0, OUTPUT_STD, generator=generator)
            else:
                param.normal_(0.0, std, generator=generator)
