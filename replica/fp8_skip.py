"""Projections left in the model dtype when the rest run in FP8: a checkpoint's `ignore` list and the
engine's `fp8_skip_modules`, in one syntax (compressed-tensors' `ignore`).

A pattern is a Hugging Face module name (`model.layers.29.mlp.down_proj`; the `model.` prefix may be
left out) or `re:` and a regular expression matched from the name's start (`re:.*layers\\.2[89]\\.`).
Our module fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj`: a fused projection stays in
the model dtype when every one of its parts matches, and a pattern that matches only some of them is
refused (one GEMM has one dtype; vLLM refuses the same). Why it matters: on SmolLM2-135M, FP8 on
every projection raises perplexity +5.1-6.1%, with the last two layers left in float32 +2.6-3.3%
(means of dithered runs on three CPU kernels' roundings; with the rest of the model in float64, the
same on every kernel, +4.65% and +1.72%; bench/fp8_quality.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import torch
from torch import nn

from replica.errors import CheckpointError, InvalidRequestError
from replica.fp8_checkpoint import quantization_config
from replica.fp8_linear import FP8Linear, fp8_modules
from replica.lazy_memory import UninitialisedLinear
from replica.weights import FUSED_PARTS

# Where the two FP8 schemes keep their list (fp8: either key, by the writer's version).
_IGNORE_KEYS = ("ignore", "ignored_layers", "modules_to_not_convert")


def checkpoint_ignore(config) -> tuple[str, ...]:
    """The patterns of a transformers config's `quantization_config` that leave modules unquantised."""
    qc = quantization_config(config) or {}
    found: list[str] = []
    for key in _IGNORE_KEYS:
        value = qc.get(key) or ()
        found += [value] if isinstance(value, str) else list(value)
    return tuple(found)


def hf_names(module_name: str) -> tuple[str, ...]:
    """The Hugging Face module names one of our projections holds (three for qkv, two for gate/up)."""
    parent, _, leaf = module_name.rpartition(".")
    parts = FUSED_PARTS.get(leaf, (leaf,))
    return tuple(f"model.{parent}.{part}" for part in parts)


def matches(name: str, pattern: str) -> bool:
    """Whether a Hugging Face module name matches one pattern (see the module's docstring)."""
    if pattern.startswith("re:"):
        regex = pattern[3:]
        return re.match(regex, name) is not None or re.match(regex, name.removeprefix("model.")) is not None
    return pattern in (name, name.removeprefix("model."))


def skipped_modules(
    names: Iterable[str], checkpoint: Sequence[str] = (), requested: Sequence[str] = ()
) -> list[str]:
    """Which of our FP8 projections (`names`) stay in the model dtype. A fused projection matched in
    part is refused; a pattern of `requested` that matches no projection is refused (a typo would
    otherwise quantise what the user meant to keep). A checkpoint's patterns may match nothing here
    (`lm_head`, which is never FP8)."""
    names = list(names)
    keep = []
    for name in names:
        parts = hf_names(name)
        hits = [any(matches(part, p) for p in (*checkpoint, *requested)) for part in parts]
        if all(hits):
            keep.append(name)
        elif any(hits):
            matched = [part for part, hit in zip(parts, hits, strict=True) if hit]
            raise CheckpointError(
                f"{', '.join(matched)} left unquantised but not the rest of {', '.join(parts)}: the engine "
                "runs them as one product, which is FP8 or not as a whole"
            )
    for pattern in requested:
        if not any(matches(part, pattern) for name in names for part in hf_names(name)):
            raise InvalidRequestError(
                f"fp8_skip_modules pattern {pattern!r} matches no projection of this model "
                "(names like 'model.layers.0.mlp.down_proj', or 're:' and a regular expression)"
            )
    return keep


def keep_in_model_dtype(model: nn.Module, names: Sequence[str], dtype: torch.dtype) -> None:
    """Swap each named FP8 projection for a plain linear layer in `dtype`, on the same device, empty:
    the loader (or the random initialiser) writes it as it writes every other full-precision layer."""
    modules = fp8_modules(model)
    for name in names:
        old: FP8Linear = modules[name]
        parent_name, _, leaf = name.rpartition(".")
        new = UninitialisedLinear(
            old.in_features,
            old.out_features,
            bias=old.bias is not None,
            device=old.weight.device,
            dtype=dtype,
        )
        setattr(model.get_submodule(parent_name), leaf, new)
