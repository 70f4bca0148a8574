"""Fill our Llama module from Hugging Face checkpoint tensors, or with random values; and back.

Our module fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj` (weights and, where the
architecture has them, biases); every other name is Hugging Face's without the `model.` prefix.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from replica.checkpoint import checkpoint_tensors
from replica.errors import CheckpointError
from replica.fp8_checkpoint import UNUSED_SCALES, Fp8Writer, KVScaleReader
from replica.fp8_linear import fp8_modules, init_random_fp8
from replica.llama import LlamaForCausalLM

# HF projection -> (our fused name, index of the shard inside it)
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_FUSED_NAME = re.compile(
    r"\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias|weight_scale|{})$".format(
        "|".join(UNUSED_SCALES)
    )
)  # FP8 checkpoints add scales beside the weights (replica/fp8_checkpoint.py)
# our fused name -> its HF projections, in shard order
FUSED_PARTS = {
    fused: tuple(hf for hf, (f, _) in sorted(_FUSED.items(), key=lambda kv: kv[1][1]) if f == fused)
    for fused in {f for f, _ in _FUSED.values()}
}
_SHARDS = {fused: len(parts) for fused, parts in FUSED_PARTS.items()}


def load_checkpoint(model: LlamaForCausalLM, model_dir: Path) -> None:
    """Copy a checkpoint into `model`; every parameter must be written, every tensor must fit one.
    FP8 projections (replica/fp8_linear.py) take float8 weights with their scales, or quantise
    full-precision ones as they arrive."""
    params = dict(model.named_parameters())
    written: set[str] = set()
    fp8 = Fp8Writer(model) if fp8_modules(model) else None
    kv_scales = KVScaleReader()
    for hf_name, tensor, path in checkpoint_tensors(model_dir):
        name = hf_name.removeprefix("model.")
        if "rotary_emb" in name or (name == "lm_head.weight" and model.config.tie_word_embeddings):
            continue  # rope tables are computed; a tied head is the embedding (some writers save both)
        if kv_scales.takes(name, tensor, path):
            continue  # KV-cache scales: used when the cache is FP8 (replica/kv_quant.py)
        match = _FUSED_NAME.search(name)
        shard = None
        if match:
            fused, shard = _FUSED[match.group(1)]
            name = f"{name[: match.start()]}.{fused}.{match.group(2)}"
        if fp8 is not None and fp8.takes(name):
            fp8.put(name, _rows(model, name, shard), tensor, path)
            continue
        if name not in params:
            raise CheckpointError(f"{path}: tensor {hf_name} has no place in {model.spec.architecture}")
        if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise CheckpointError(f"{path}: {hf_name} is float8 and {name} is not an FP8 projection")
        target = _target(model, params[name], name, shard)
        if tuple(target.shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"{path}: tensor {hf_name} has shape {tuple(tensor.shape)}, the config asks for "
                f"{tuple(target.shape)}"
            )
        with torch.no_grad():
            target.copy_(tensor)
        written.add(name if shard is None else f"{name}#{shard}")
    _check_complete(model, written, model_dir)
    kv_scales.apply(model, model_dir)
    if fp8 is not None:
        fp8.check_complete(model_dir)


def _shard_sizes(model: LlamaForCausalLM, fused: str) -> list[int]:
    cfg = model.config
    if fused == "gate_up_proj":
        return [cfg.intermediate_size] * 2
    q = cfg.num_attention_heads * model.head_dim
    kv = cfg.num_key_value_heads * model.head_dim
    return [q, kv, kv]


def _rows(model: LlamaForCausalLM, name: str, shard: int | None) -> slice:
    """The rows of a fused parameter that one HF tensor fills (all rows when it is not fused)."""
    if shard is None:
        return slice(None)
    sizes = _shard_sizes(model, name.split(".")[-2])
    start = sum(sizes[:shard])
    return slice(start, start + sizes[shard])


def _target(model: LlamaForCausalLM, param: torch.Tensor, name: str, shard: int | None) -> torch.Tensor:
    """The parameter, or the rows of a fused parameter that one HF tensor fills."""
    return param[_rows(model, name, shard)]


def _check_complete(model: LlamaForCausalLM, written: set[str], model_dir: Path) -> None:
    """Every parameter (each shard of a fused one) was written; the error names HF's tensors."""
    missing = []
    for name, _ in model.named_parameters():
        parts = name.split(".")
        if parts[-2] not in _SHARDS:
            if name not in written:
                missing.append(name if name.startswith("lm_head") else f"model.{name}")
            continue
        hf_parts = [p for p, (fused, _) in _FUSED.items() if fused == parts[-2]]
        base = ".".join(parts[:-2])
        for shard, part in enumerate(hf_parts):
            if f"{name}#{shard}" not in written:
                missing.append(f"model.{base}.{part}.{parts[-1]}")
    if missing:
        shown = ", ".join(missing[:4])
        raise CheckpointError(f"{model_dir}: the checkpoint lacks {len(missing)} tensors: {shown}")


def hf_state_dict(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """Our parameters under Hugging Face's names, fused matrices split (views, no copies)."""
    state: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        parts = name.split(".")
        fused = parts[-2] if len(parts) >= 2 else ""
        if fused in _SHARDS:
            base = ".".join(parts[:-2])
            hf_parts = [p for p, (f, _) in _FUSED.items() if f == fused]
            for part, chunk in zip(hf_parts, tensor.split(_shard_sizes(model, fused)), strict=True):
                state[f"model.{base}.{part}.{parts[-1]}"] = chunk
        elif name.startswith("lm_head"):
            if not model.config.tie_word_embeddings:
                state[name] = tensor
        else:
            state[f"model.{name}"] = tensor
    return state


# Output and embedding matrices get a larger scale, so logits spread like a trained model's and
# greedy comparisons between implementations are not decided by near-ties between random logits.
OUTPUT_STD = 0.2


def init_random(model: LlamaForCausalLM, seed: int) -> None:
    """Random weights for throughput work: the step time does not depend on the values."""
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    std = getattr(model.config, "initializer_range", 0.02)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight")) or name == "norm.weight":
                param.fill_(1.0)
            elif name in ("embed_tokens.weight", "lm_head.weight"):
                param.normal_(0.0, OUTPUT_STD, generator=generator)
            else:
                param.normal_(0.0, std, generator=generator)
        init_random_fp8(model, std, generator)  # FP8 projections hold their weights in buffers
