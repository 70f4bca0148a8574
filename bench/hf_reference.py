"""A transformers model holding exactly our weights: the baseline in benchmarks and GPU checks."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from replica.model_loader import LoadedModel
from replica.weights import hf_state_dict


def hf_model_like(loaded: LoadedModel) -> PreTrainedModel:
    """transformers' model of the loaded architecture (Llama, Qwen2, ...) with our (possibly random)
    weights, q/k/v and gate/up unfused."""
    param = next(loaded.model.parameters())
    with torch.device(param.device):
        hf = AutoModelForCausalLM.from_config(loaded.config, dtype=param.dtype)
    missing, unexpected = hf.load_state_dict(hf_state_dict(loaded.model), strict=False)
    if unexpected or any(not name.startswith("lm_head") for name in missing):
        raise RuntimeError(f"weights do not map onto transformers' model: {missing[:3]} {unexpected[:3]}")
    if loaded.config.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()
