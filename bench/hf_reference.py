"""A transformers model holding exactly our weights: the baseline in benchmarks and GPU checks."""

from __future__ import annotations

import torch
from transformers import LlamaForCausalLM as HFLlama

from replica.model_loader import LoadedModel


def hf_model_like(loaded: LoadedModel) -> HFLlama:
    """Build transformers' Llama with our (possibly random) weights, unfusing q/k/v and gate/up."""
    ours = loaded.model
    param = next(ours.parameters())
    previous = torch.get_default_dtype()
    torch.set_default_dtype(param.dtype)
    try:
        with torch.device(param.device):
            hf = HFLlama(loaded.config)
    finally:
        torch.set_default_dtype(previous)
    hf.load_state_dict(_hf_state_dict(ours), strict=False)
    if loaded.config.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()


def _hf_state_dict(ours) -> dict[str, torch.Tensor]:
    cfg = ours.config
    q = cfg.num_attention_heads * ours.head_dim
    kv = cfg.num_key_value_heads * ours.head_dim
    state: dict[str, torch.Tensor] = {}
    for name, tensor in ours.state_dict().items():
        if name.endswith("qkv_proj.weight"):
            base = name.removesuffix("qkv_proj.weight")
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), tensor.split([q, kv, kv]), strict=True):
                state[f"model.{base}{part}.weight"] = chunk
        elif name.endswith("gate_up_proj.weight"):
            base = name.removesuffix("gate_up_proj.weight")
            for part, chunk in zip(("gate_proj", "up_proj"), tensor.chunk(2), strict=True):
                state[f"model.{base}{part}.weight"] = chunk
        elif name.startswith("lm_head"):
            state[name] = tensor
        else:
            state[f"model.{name}"] = tensor
    return state
