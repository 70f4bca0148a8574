"""A directory the engine cannot serve fails at load with an error type and a message naming the file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from replica import CheckpointError, Engine, EngineConfig, UnknownModelError, UnsupportedArchitectureError
from replica.model_loader import load_model
from tests.replica.checkpoints import random_hf_model, tiny_config

CPU = torch.device("cpu")


def _write(tmp_path: Path, name: str = "llama-tied", shard: str | None = None) -> Path:
    """A tiny checkpoint without a tokenizer: every failure here comes before the tokenizer loads."""
    kind = tiny_config(name, 256, hidden=32, heads=2, kv_heads=1)
    out = tmp_path / name
    random_hf_model(kind).save_pretrained(out, **({"max_shard_size": shard} if shard else {}))
    return out


def _load(model_dir: Path):
    return load_model(str(model_dir), CPU, torch.float32, random_weights=False)


def _edit_config(model_dir: Path, **changes) -> None:
    path = model_dir / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_an_unknown_architecture_is_refused_with_the_supported_list(tmp_path):
    model_dir = _write(tmp_path)
    _edit_config(model_dir, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(UnsupportedArchitectureError) as info:
        _load(model_dir)
    message = str(info.value)
    assert "config.json" in message and "GPT2LMHeadModel" in message
    for supported in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert supported in message


def test_a_model_type_transformers_does_not_know_is_refused_the_same_way(tmp_path):
    model_dir = _write(tmp_path)
    _edit_config(model_dir, architectures=None, model_type="fairlane-unknown")
    with pytest.raises(UnsupportedArchitectureError, match=r"fairlane-unknown.*Qwen3ForCausalLM"):
        _load(model_dir)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}}, "dynamic"),
        ({"hidden_act": "gelu"}, "gelu"),
    ],
)
def test_a_setting_the_engine_does_not_implement_is_refused(tmp_path, changes, named):
    model_dir = _write(tmp_path)
    _edit_config(model_dir, **changes)
    with pytest.raises(UnsupportedArchitectureError, match=named):
        _load(model_dir)


def test_a_missing_shard_is_named_before_any_weight_is_read(tmp_path):
    model_dir = _write(tmp_path, shard="100KB")
    shards = sorted(model_dir.glob("model-*.safetensors"))
    assert len(shards) > 1
    shards[-1].unlink()
    with pytest.raises(CheckpointError, match=rf"model\.safetensors\.index\.json: .*{shards[-1].name}"):
        _load(model_dir)


def test_a_corrupt_safetensors_file_is_named(tmp_path):
    model_dir = _write(tmp_path)
    path = model_dir / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a download cut short
    with pytest.raises(
        CheckpointError, match=re.escape("model.safetensors: not a readable safetensors file")
    ):
        _load(model_dir)
    path.write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match=re.escape("model.safetensors")):
        _load(model_dir)


def test_missing_tensors_are_named(tmp_path):
    model_dir = _write(tmp_path)
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["model.layers.1.self_attn.k_proj.weight"], tensors["model.norm.weight"]
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="lacks 2 tensors") as info:
        _load(model_dir)
    assert "model.layers.1.self_attn.k_proj.weight" in str(info.value)
    assert "model.norm.weight" in str(info.value)


def test_a_tensor_of_the_wrong_shape_or_without_a_place_is_named(tmp_path):
    model_dir = _write(tmp_path)
    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    tensors["model.layers.0.mlp.up_proj.weight"] = tensors["model.layers.0.mlp.up_proj.weight"][:-1].clone()
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError,
        match=re.escape("model.safetensors: tensor model.layers.0.mlp.up_proj.weight has shape"),
    ):
        _load(model_dir)
    tensors = load_file(str(path))
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.zeros(64, 32)
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(32)  # Llama without attention_bias
    save_file(tensors, str(path), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=re.escape("q_proj.bias has no place in LlamaForCausalLM")):
        _load(model_dir)


def test_a_bad_generation_config_is_named(tmp_path):
    model_dir = _write(tmp_path)
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": [2], "top_p": 0.0}))
    with pytest.raises(CheckpointError, match=re.escape("generation_config.json: top_p")):
        _load(model_dir)
    (model_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": "2"}))
    with pytest.raises(CheckpointError, match=re.escape("generation_config.json: eos_token_id")):
        _load(model_dir)


async def test_the_engine_start_raises_the_loader_error(tmp_path):
    model_dir = _write(tmp_path)
    (model_dir / "config.json").unlink()
    engine = Engine(EngineConfig(model=str(model_dir), device="cpu"))
    with pytest.raises(CheckpointError, match=re.escape("config.json")):
        await engine.start()
    assert issubclass(CheckpointError, UnknownModelError) and issubclass(
        UnsupportedArchitectureError, UnknownModelError
    )
