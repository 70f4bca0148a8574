"""Turn a model name or path into a ready Llama-family module and its tokenizer, never touching a hub.

A directory is a Hugging Face checkpoint of a supported architecture (replica/architectures.py):
config.json, safetensors weights (one file, or shards with model.safetensors.index.json), its
tokenizer files, and optionally generation_config.json. Weights load in the engine's dtype whatever
their own (bf16, fp16 or float32). With quantization "fp8", or from an FP8 checkpoint (its
quantization_config, replica/fp8_checkpoint.py), the projections are FP8 (replica/fp8_linear.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import AutoConfig, AutoTokenizer, LlamaConfig, PreTrainedTokenizerBase

from replica.architectures import arch_spec, architecture_of
from replica.checkpoint import checkpoint_files
from replica.embedded_model import cache_root, ensure_converted
from replica.errors import CheckpointError, InvalidRequestError, UnknownModelError
from replica.fp8_checkpoint import checkpoint_scheme
from replica.fp8_linear import fp8_modules, quantized_linears, require_fp8_device
from replica.fp8_skip import checkpoint_ignore, keep_in_model_dtype, skipped_modules
from replica.generation_defaults import GenerationDefaults, eos_list, read_generation_defaults
from replica.llama import LlamaForCausalLM
from replica.presets import REAL_WEIGHTS, SHAPES
from replica.weights import init_random, load_checkpoint

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    tokenizer: PreTrainedTokenizerBase | None
    config: LlamaConfig  # the checkpoint's transformers config (LlamaConfig, Qwen2Config, ...)
    source: str  # a directory, or "random:<preset>"
    generation_defaults: GenerationDefaults = field(default_factory=GenerationDefaults)
    eos_token_ids: tuple[int, ...] = ()  # config, generation config and tokenizer ends, sorted
    max_model_len: int = 0  # the model's own limit: max_position_embeddings, capped at a sliding window
    load_seconds: float = 0.0  # config to ready module, weights included

    @property
    def architecture(self) -> str:
        return self.model.spec.architecture


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
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    random_weights: bool,
    seed: int = 0,
    quantization: str | None = None,
    fp8_skip: Sequence[str] = (),
) -> LoadedModel:
    """`quantization` "fp8": FP8 projections, quantised at load (an FP8 checkpoint turns it on itself),
    except those `fp8_skip` names (replica/fp8_skip.py) and the checkpoint's own `ignore` list."""
    start = time.perf_counter()
    if random_weights:
        loaded = _load_random(name, device, dtype, seed, quantization, fp8_skip)
    else:
        loaded = _load_dir(name, device, dtype, quantization, fp8_skip)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the copies are asynchronous: count them in
    loaded.load_seconds = time.perf_counter() - start
    log.info("loaded %s (%s, %s) in %.2f s", loaded.source, loaded.architecture, dtype, loaded.load_seconds)
    return loaded


def read_config(model_dir: Path):
    """The directory's transformers config and ArchSpec, or an error naming config.json."""
    path = model_dir / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: missing or not JSON ({exc})") from exc
    try:  # before transformers, which knows other architectures (and fails on unknown ones its way)
        architecture_of(SimpleNamespace(**raw) if isinstance(raw, dict) else None)
        config = AutoConfig.from_pretrained(model_dir)
        return config, arch_spec(config)
    except UnknownModelError as exc:
        raise type(exc)(f"{path}: {exc}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path}: transformers cannot read it ({exc})") from exc


def _load_dir(
    name: str, device: torch.device, dtype: torch.dtype, quantization: str | None, fp8_skip: Sequence[str]
) -> LoadedModel:
    model_dir = model_dir_for(name)
    config, spec = read_config(model_dir)
    if checkpoint_scheme(config, model_dir / "config.json") is not None:
        quantization = "fp8"  # a float8 checkpoint is served as it is, never widened
    if quantization is not None:
        require_fp8_device(device, f"{model_dir} (quantization '{quantization}')")
    checkpoint_files(model_dir)  # every shard present before any is read or memory is taken
    generation = read_generation_defaults(model_dir)
    model = build_model(config, device, dtype, quantization, fp8_skip)
    load_checkpoint(model, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ends = _end_ids(config, generation, tokenizer)
    return LoadedModel(model.eval(), tokenizer, config, str(model_dir), generation, ends, spec.max_positions)


def _end_ids(config, generation: GenerationDefaults, tokenizer) -> tuple[int, ...]:
    """Every id that ends a sequence: config.json's, the generation config's and the tokenizer's."""
    ids = set(eos_list(getattr(config, "eos_token_id", None))) | set(generation.eos_token_ids)
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    return tuple(sorted(ids))


def _load_random(
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    quantization: str | None,
    fp8_skip: Sequence[str],
) -> LoadedModel:
    if name not in SHAPES:
        raise UnknownModelError(f"no random-weight preset {name!r}; presets: {', '.join(sorted(SHAPES))}")
    if quantization is not None:
        require_fp8_device(device, f"quantization '{quantization}'")
    config = LlamaConfig(**SHAPES[name].to_config_dict())
    model = build_model(config, device, dtype, quantization, fp8_skip)
    init_random(model, seed)
    tokenizer = _tokenizer_for_random(name)
    ends = _end_ids(config, GenerationDefaults(), tokenizer)
    source, limit = f"random:{name}", model.spec.max_positions
    return LoadedModel(model.eval(), tokenizer, config, source, eos_token_ids=ends, max_model_len=limit)


def _tokenizer_for_random(name: str) -> PreTrainedTokenizerBase | None:
    """Random SmolLM2-shaped weights reuse its tokenizer when the converted cache is there."""
    cached = cache_root() / name
    if name in REAL_WEIGHTS and (cached / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(cached)
    return None  # token-id prompts only


def build_model(
    config,
    device: torch.device,
    dtype: torch.dtype,
    quantization: str | None = None,
    fp8_skip: Sequence[str] = (),
) -> LlamaForCausalLM:
    """The module, empty, on `device`; with quantization "fp8" its projections are FP8Linear, except
    those the checkpoint's `ignore` list or `fp8_skip` name (replica/fp8_skip.py): those stay in `dtype`."""
    if fp8_skip and quantization is None:
        raise InvalidRequestError(
            "fp8_skip_modules names projections to leave out of FP8; quantization is not 'fp8'"
        )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build in the target dtype: an 8B model never exists in float32
    try:
        with torch.device(device), quantized_linears(quantization):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    if quantization is not None:
        keep = skipped_modules(fp8_modules(model), checkpoint_ignore(config), fp8_skip)
        keep_in_model_dtype(model, keep, dtype)
    return model
