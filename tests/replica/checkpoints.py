"""Tiny random checkpoints of every supported architecture, written with transformers' save_pretrained.

Each kind differs from plain Llama where a real checkpoint of its family does: Llama 3.x rope scaling
and an untied head, Llama's optional attention and MLP biases, Qwen2's q/k/v biases, Qwen3's
per-head q/k norms with a head size that is not hidden ÷ heads, Mistral's sliding window. Biases
and norm weights are random (transformers starts them at 0 and 1, which would hide a name mapped to
the wrong place); projections get a 1/√fan-in scale, so each layer moves the residual stream as
much as the embedding does (at transformers' 0.02 the output follows the last token whatever
attention computes, and a wrong rope or bias goes unseen); the embeddings and head get
replica/weights.py's OUTPUT_STD so greedy choices are not decided by near-ties.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
)

from replica.weights import OUTPUT_STD

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


@dataclass(frozen=True)
class Kind:
    """One tiny checkpoint to write: its architecture's config, how it is saved."""

    name: str
    config: PretrainedConfig
    dtype: torch.dtype = torch.float32  # the dtype of the saved tensors
    max_shard_size: str | None = None  # a small size makes save_pretrained write an index


def tiny_config(name: str, vocab_size: int, hidden: int = 64, heads: int = 4, kv_heads: int = 2) -> Kind:
    """A tiny config of kind `name` (one of KINDS)."""
    common = dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=3,
        num_attention_heads=heads, num_key_value_heads=kv_heads, rms_norm_eps=1e-6, bos_token_id=1,
        eos_token_id=2, pad_token_id=2,
    )  # fmt: skip
    if name == "llama-tied":
        return Kind(name, LlamaConfig(**common, tie_word_embeddings=True, max_position_embeddings=4096))
    if name == "llama3-untied":
        config = LlamaConfig(
            **common, tie_word_embeddings=False, max_position_embeddings=131072, rope_parameters=LLAMA3_ROPE
        )
        return Kind(name, config, max_shard_size="2MB")
    if name == "llama-bias":  # attention_bias (q, k, v and o) and mlp_bias (gate, up and down)
        config = LlamaConfig(
            **common,
            tie_word_embeddings=False,
            max_position_embeddings=8192,
            attention_bias=True,
            mlp_bias=True,
        )
        return Kind(name, config)
    if name == "qwen2":
        rope = {"rope_type": "default", "rope_theta": 1000000.0}
        config = Qwen2Config(
            **common, tie_word_embeddings=False, max_position_embeddings=32768, rope_parameters=rope
        )
        return Kind(name, config, dtype=torch.bfloat16)
    if name == "qwen3":  # head_dim 2 × hidden ÷ heads, as Qwen3-0.6B's 128 against 1024 ÷ 16
        config = Qwen3Config(
            **common, head_dim=2 * hidden // heads, tie_word_embeddings=True, max_position_embeddings=40960
        )
        return Kind(name, config)
    if name == "mistral":  # the window caps the engine's sequences: 1024 of 4096 positions
        config = MistralConfig(
            **common, tie_word_embeddings=False, max_position_embeddings=4096, sliding_window=1024
        )
        return Kind(name, config, dtype=torch.float16)
    raise ValueError(f"no tiny checkpoint kind {name!r}")


KINDS = ("llama-tied", "llama3-untied", "llama-bias", "qwen2", "qwen3", "mistral")


def random_hf_model(kind: Kind, seed: int = 0):
    """transformers' model of the kind's config, float32, with every weight random."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(kind.config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("proj.weight"):  # at transformers' 0.02 the embeddings drown every layer
                param.normal_(0.0, param.shape[1] ** -0.5)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
            elif name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
            elif name.endswith(("embed_tokens.weight", "lm_head.weight")):
                param.normal_(0.0, OUTPUT_STD)
    return model


def save_checkpoint(model, kind: Kind, out: Path, tokenizer, generation: dict | None = None) -> Path:
    """save_pretrained the model (in the kind's dtype and sharding), a tokenizer (a directory to copy
    one from, or a tokenizer) and a generation config."""
    from transformers import AutoTokenizer

    if isinstance(tokenizer, Path):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer)
    if generation is not None:
        model.generation_config = GenerationConfig(**generation)
    options = {"max_shard_size": kind.max_shard_size} if kind.max_shard_size else {}
    copy.deepcopy(model).to(kind.dtype).save_pretrained(out, **options)
    tokenizer.save_pretrained(out)
    return out


def hf_from_dir(model_dir: Path):
    """transformers' own load of a written directory, in float32: the reference."""
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_greedy_many(
    hf_model, prompts: list[list[int]], max_tokens: list[int], eos: list[int]
) -> list[list[int]]:
    """transformers' greedy generate for each prompt alone, stopping on any of `eos` (none: no end)."""
    outputs = []
    device = next(hf_model.parameters()).device
    if not eos:
        hf_model.generation_config.eos_token_id = None  # otherwise generate falls back to the config's
    for prompt, limit in zip(prompts, max_tokens, strict=True):
        ids = torch.tensor([prompt], device=device)
        with torch.no_grad():
            out = hf_model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=limit, do_sample=False,
                eos_token_id=eos or None, pad_token_id=(eos or [0])[0],
            )  # fmt: skip
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs


def logit_gaps(hf_model, prompt: list[int], tokens: list[int]) -> list[float]:
    """For each generated token, transformers' highest logit minus the token's, given the prompt and
    the tokens before it (teacher forcing): 0 where the token is transformers' own greedy choice, a
    small value where a near-tie went the other way."""
    device = next(hf_model.parameters()).device
    ids = torch.tensor([prompt + tokens], device=device)
    with torch.no_grad():
        logits = hf_model(ids).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(tokens)].float()
    chosen = logits.gather(-1, torch.tensor(tokens, device=device)[:, None])[:, 0]
    return (logits.max(-1).values - chosen).tolist()


def first_divergence(ours: list[int], ref: list[int]) -> int:
    """The first position where two outputs differ (the shorter length when one extends the other)."""
    return next(
        (i for i, (a, b) in enumerate(zip(ours, ref, strict=False)) if a != b), min(len(ours), len(ref))
    )
