"""Tiny PEFT LoRA adapters with random, non-zero A and B, and the transformers + PEFT reference.

PEFT starts B at zero (an untrained adapter adds nothing, which would hide every mistake), so both
matrices are overwritten: A with a 1/√in scale and B with a 1/√r one, so that with a scaling near
one the delta moves each projection about as much as the base weight does.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(
    hf_model,
    out: Path,
    targets=ALL_TARGETS,
    rank: int = 8,
    alpha: float = 8.0,
    seed: int = 0,
    rslora: bool = False,
    **extra,
) -> Path:
    """save_pretrained a LoRA adapter of `hf_model` (its weights untouched) with random A and B."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(targets), use_rslora=rslora, lora_dropout=0.0, **extra
    )
    peft_model = get_peft_model(copy.deepcopy(hf_model), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * param.shape[1] ** -0.5)
    peft_model.save_pretrained(out)
    return out


def peft_reference(model_dir: Path, adapter_dir: Path):
    """transformers' model of `model_dir` in float32 with the adapter loaded unmerged."""
    from peft import PeftModel

    from tests.replica.checkpoints import hf_from_dir

    return PeftModel.from_pretrained(hf_from_dir(model_dir), adapter_dir).eval()
