"""Which Hugging Face decoder architectures the engine runs, and how each differs from Llama.

All four are the Llama block (RMSNorm, rotary attention with grouped KV heads, SiLU-gated MLP); an
`ArchSpec` names what one checkpoint adds to it, so `replica/llama.py` builds one module for all:

- Qwen2: a bias on q, k and v (none on the output projection);
- Qwen3: an RMSNorm over each query and key head before the rotary embedding, and a head size
  (`head_dim`) that need not be hidden ÷ heads;
- Mistral: a sliding attention window. Within the window sliding attention is full attention, so
  the engine caps a sequence at the window instead of implementing it (`max_positions`);
- Llama (and Qwen3) may carry `attention_bias` (q, k, v and output projection) and Llama
  `mlp_bias` (gate, up and down).

Anything else is refused here, at load, with the supported list: a checkpoint the engine would run
with a setting silently ignored gives wrong tokens, not an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from replica.errors import UnsupportedArchitectureError
from replica.rope import SUPPORTED_ROPE_TYPES, rope_parameters

# config.architectures[0] -> config.model_type
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass(frozen=True)
class ArchSpec:
    """What one checkpoint's architecture adds to the plain Llama block."""

    architecture: str  # a key of SUPPORTED_ARCHITECTURES
    head_dim: int
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sliding_window: int | None  # a window some layer uses, None when every layer attends to all
    max_positions: int  # the longest sequence: max_position_embeddings, capped at the window

    @property
    def uses_bias(self) -> bool:
        return self.qkv_bias or self.o_bias or self.mlp_bias


def supported_list() -> str:
    return ", ".join(f"{name} ({kind})" for name, kind in sorted(SUPPORTED_ARCHITECTURES.items()))


def architecture_of(cfg) -> str:
    """The supported architecture a config names, or UnsupportedArchitectureError."""
    names = list(getattr(cfg, "architectures", None) or [])
    model_type = getattr(cfg, "model_type", None)
    if not names:  # an older config without `architectures`: its model type decides
        names = [n for n, t in SUPPORTED_ARCHITECTURES.items() if t == model_type]
    if len(names) != 1 or names[0] not in SUPPORTED_ARCHITECTURES:
        shown = ", ".join(names) if names else f"model_type {model_type!r}"
        raise UnsupportedArchitectureError(
            f"architecture {shown} is not supported; supported: {supported_list()}"
        )
    return names[0]


def arch_spec(cfg) -> ArchSpec:
    """The ArchSpec of a transformers config, after checking every setting the engine implements."""
    name = architecture_of(cfg)
    _check_common(cfg, name)
    attention_bias = bool(getattr(cfg, "attention_bias", False))
    window = _sliding_window(cfg, name)
    limit = cfg.max_position_embeddings if window is None else min(cfg.max_position_embeddings, window)
    return ArchSpec(
        architecture=name,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        qkv_bias=name == "Qwen2ForCausalLM" or (attention_bias and name != "MistralForCausalLM"),
        o_bias=attention_bias and name in ("LlamaForCausalLM", "Qwen3ForCausalLM"),
        mlp_bias=bool(getattr(cfg, "mlp_bias", False)) and name == "LlamaForCausalLM",
        qk_norm=name == "Qwen3ForCausalLM",
        sliding_window=window,
        max_positions=limit,
    )


def _check_common(cfg, name: str) -> None:
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu":
        raise UnsupportedArchitectureError(f"{name} with hidden_act {act!r}: the engine implements silu only")
    params = rope_parameters(cfg)
    if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedArchitectureError(
            f"{name} with rope type {params['rope_type']!r}: supported rope types are "
            f"{', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedArchitectureError(f"{name} with partial_rotary_factor: the engine rotates all dims")
    if name == "MistralForCausalLM" and getattr(cfg, "attention_bias", False):
        raise UnsupportedArchitectureError("MistralForCausalLM with attention_bias: Mistral has no biases")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise UnsupportedArchitectureError(
            f"{name}: {cfg.num_attention_heads} heads do not split into {cfg.num_key_value_heads} KV groups"
        )


def _sliding_window(cfg, name: str) -> int | None:
    """The attention window some layer uses. Mistral applies `sliding_window` to every layer when it
    is set; Qwen2/3 only to layers marked "sliding_attention" (transformers sets it to None unless
    `use_sliding_window`)."""
    window = getattr(cfg, "sliding_window", None)
    if not window:
        return None
    if name == "MistralForCausalLM":
        return int(window)
    layer_types = getattr(cfg, "layer_types", None) or []
    return int(window) if "sliding_attention" in layer_types else None


def check_cuda_head_dim(head_dim: int) -> None:
    """The CUDA kernels index a head with tl.arange, which takes powers of two (every checkpoint of
    the supported families has 64 or 128); other sizes run on the CPU."""
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        raise UnsupportedArchitectureError(
            f"head_dim {head_dim}: the CUDA kernels take powers of two from 16 to 256"
        )
