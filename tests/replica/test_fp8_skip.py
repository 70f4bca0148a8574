"""Projections left out of FP8 (replica/fp8_skip.py): the pattern syntax, fused projections only as a
whole, a pattern that matches nothing refused, and the engine's `fp8_skip_modules` building those
projections in the model dtype."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from replica.errors import CheckpointError, InvalidRequestError
from replica.fp8_linear import FP8Linear, fp8_modules
from replica.fp8_skip import checkpoint_ignore, hf_names, matches, skipped_modules
from replica.model_loader import build_model
from replica.weights import init_random

CPU = torch.device("cpu")
NAMES = [
    f"layers.{i}.{m}"
    for i in range(3)
    for m in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
]


def test_our_fused_projections_are_their_hugging_face_parts() -> None:
    attn = "model.layers.3.self_attn"
    assert hf_names("layers.3.self_attn.qkv_proj") == (f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj")
    assert hf_names("layers.3.mlp.gate_up_proj") == (
        "model.layers.3.mlp.gate_proj",
        "model.layers.3.mlp.up_proj",
    )
    assert hf_names("layers.3.mlp.down_proj") == ("model.layers.3.mlp.down_proj",)


def test_patterns_are_names_with_or_without_the_model_prefix_or_anchored_regexes() -> None:
    name = "model.layers.12.mlp.down_proj"
    assert matches(name, name) and matches(name, "layers.12.mlp.down_proj")
    assert not matches(name, "layers.1.mlp.down_proj") and not matches(name, "mlp.down_proj")
    assert matches(name, r"re:.*mlp\.down_proj") and matches(name, r"re:layers\.1[0-9]\.")
    assert not matches(name, r"re:mlp")  # anchored at the start, as compressed-tensors matches


def test_a_whole_layer_or_one_kind_of_projection_is_kept() -> None:
    assert skipped_modules(NAMES, requested=[r"re:.*layers\.2\."]) == NAMES[8:]
    assert skipped_modules(NAMES, requested=[r"re:.*down_proj"]) == [
        n for n in NAMES if n.endswith("down_proj")
    ]
    both = [r"re:.*gate_proj", r"re:.*up_proj"]  # a fused pair named part by part, every part named
    assert skipped_modules(NAMES, requested=both) == [n for n in NAMES if n.endswith("gate_up_proj")]
    assert skipped_modules(NAMES, checkpoint=["lm_head"]) == []  # never FP8: matching nothing is fine


def test_a_fused_projection_named_in_part_is_refused() -> None:
    with pytest.raises(
        CheckpointError, match=r"model\.layers\.0\.self_attn\.q_proj left unquantised but not"
    ):
        skipped_modules(NAMES, requested=["model.layers.0.self_attn.q_proj"])


def test_a_requested_pattern_that_matches_nothing_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match=r"'re:.*layers\\\\.30\\\\.' matches no projection"):
        skipped_modules(NAMES, requested=[r"re:.*layers\.30\."])


def test_the_ignore_lists_of_both_checkpoint_schemes_are_read() -> None:
    config = LlamaConfig(
        quantization_config={"quant_method": "compressed-tensors", "ignore": ["lm_head", "re:x"]}
    )
    assert checkpoint_ignore(config) == ("lm_head", "re:x")
    config = LlamaConfig(
        quantization_config={"quant_method": "fp8", "ignored_layers": ["model.layers.0.mlp.down_proj"]}
    )
    assert checkpoint_ignore(config) == ("model.layers.0.mlp.down_proj",)
    assert checkpoint_ignore(LlamaConfig()) == ()


def _config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, initializer_range=0.02,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_engine_setting_builds_the_named_projections_in_the_model_dtype(dtype) -> None:
    model = build_model(_config(), CPU, dtype, "fp8", fp8_skip=[r"re:model\.layers\.2\."])
    assert set(fp8_modules(model)) == set(NAMES[:8])
    for name in NAMES[8:]:
        module = model.get_submodule(name)
        assert type(module).__name__ == "UninitialisedLinear" and module.weight.dtype == dtype
    init_random(model, seed=0)  # random weights reach the kept projections as every other full-precision one
    assert float(model.layers[2].mlp.down_proj.weight.detach().float().std()) == pytest.approx(0.02, rel=0.2)
    assert isinstance(model.layers[1].mlp.down_proj, FP8Linear)


def test_the_setting_without_fp8_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="quantization is not 'fp8'"):
        build_model(_config(), CPU, torch.float32, None, fp8_skip=["model.layers.0.mlp.down_proj"])
