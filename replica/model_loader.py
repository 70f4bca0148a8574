"""Turn a model name or path into a ready Llama module and its tokenizer, never touching a hub."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, LlamaConfig, PreTrainedTokenizerBase

from replica.embedded_model import cache_root, ensure_converted
from replica.errors import UnknownModelError
from replica.llama import LlamaForCausalLM
from replica.presets import REAL_WEIGHTS, SHAPES
from replica.weights import init_random, load_checkpoint

log = logging.getLogger(__name__)
SUPPORTED_ARCHITECTURES = {"llama", "mistral", "qwen2"}  # Llama-shaped decoders without biases we skip


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    tokenizer: PreTrainedTokenizerBase | None
    config: LlamaConfig
    source: str  # a directory, or "random:<preset>"


def model_dir_for(name: str) -> Path:
    """A local Hugging Face directory for `name`: a path, or a real-weights preset (converted once)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if name in REAL_WEIGHTS:
        return ensure_converted(name)
    known = ", ".join(sorted(SHAPES))
    raise UnknownModelError(f"unknown model {name!r}: not a directory, and not one of the presets ({known})")


def load_model(
    name: str, device: torch.device, dtype: torch.dtype, random_weights: bool, seed: int = 0
) -> LoadedModel:
    if random_weights:
        return _load_random(name, device, dtype, seed)
    model_dir = model_dir_for(name)
    config = AutoConfig.from_pretrained(model_dir)
    if config.model_type not in SUPPORTED_ARCHITECTURES:
        raise UnknownModelError(
            f"{model_dir}: architecture {config.model_type!r} is not supported (Llama family)"
        )
    model = _build(config, device, dtype)
    load_checkpoint(model, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return LoadedModel(model.eval(), tokenizer, config, str(model_dir))


def _load_random(name: str, device: torch.device, dtype: torch.dtype, seed: int) -> LoadedModel:
    if name not in SHAPES:
        raise UnknownModelError(f"no random-weight preset {name!r}; presets: {', '.join(sorted(SHAPES))}")
    config = LlamaConfig(**SHAPES[name].to_config_dict())
    model = _build(config, device, dtype)
    init_random(model, seed)
    return LoadedModel(model.eval(), _tokenizer_for_random(name), config, f"random:{name}")


def _tokenizer_for_random(name: str) -> PreTrainedTokenizerBase | None:
    """Random SmolLM2-shaped weights reuse its tokenizer when the converted cache is there."""
    cached = cache_root() / name
    if name in REAL_WEIGHTS and (cached / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(cached)
    return None  # token-id prompts only


def _build(config, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build in the target dtype: an 8B model never exists in float32
    try:
        with torch.device(device):
            return LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
