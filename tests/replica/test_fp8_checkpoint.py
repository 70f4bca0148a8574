"""FP8 checkpoints on the CPU: compressed-tensors and 'fp8' quantization_configs read into the FP8
modules, bf16 checkpoints quantised at load, random FP8 weights, and the schemes that are refused
(replica/fp8_checkpoint.py, replica/weights.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig

from replica.errors import CheckpointError, UnsupportedArchitectureError, UnsupportedDeviceError
from replica.fp8_checkpoint import checkpoint_scheme
from replica.fp8_linear import FP8Linear, fp8_modules
from replica.fp8_quant import FP8_MAX, dequantize_rows, quantize_rows, quantize_weight
from replica.model_loader import build_model, load_model, read_config
from replica.weights import init_random, load_checkpoint
from tests.replica.checkpoints import random_hf_model, tiny_config

CPU = torch.device("cpu")
SHARDS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def _compressed_tensors_config(strategy: str, inputs: dict | None) -> dict:
    weights = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True, "dynamic": False}
    group = {
        "targets": ["Linear"],
        "weights": weights,
        "input_activations": inputs,
        "output_activations": None,
    }
    return {
        "quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": group}, "ignore": ["lm_head"], "kv_cache_scheme": None,
        "quantization_status": "compressed",
    }  # fmt: skip


def _write_fp8(
    tmp_path: Path,
    strategy: str = "channel",
    method: str = "compressed-tensors",
    unquantised: str | None = None,
) -> Path:
    """A tiny Llama (biases everywhere) whose projections are stored in e4m3 with `weight_scale`
    tensors, as published FP8 checkpoints are; also static `input_scale`s and KV-cache scales.
    ``unquantised``: a module-name prefix (`model.layers.2.`) whose projections stay in full precision,
    named in the config's ignore list as its writer would (compressed-tensors' `ignore`, the fp8
    method's `ignored_layers`)."""
    out = tmp_path / f"fp8-{method}-{strategy}"
    random_hf_model(tiny_config("llama-bias", 256, hidden=64, heads=4, kv_heads=2)).save_pretrained(out)
    tensors = load_file(out / "model.safetensors")
    kept = [n.removesuffix(".weight") for n in tensors if unquantised and n.startswith(unquantised)]
    for name in [n for n in tensors if n.endswith("proj.weight") and n.removesuffix(".weight") not in kept]:
        w = tensors[name]
        if strategy == "channel":
            q, scales = quantize_weight(w)
            scale = scales[:, None]
        else:
            scale = (w.abs().amax() / FP8_MAX).reshape(1)
            q = quantize_rows(w, scale.expand(w.shape[0]))
        base = name.removesuffix(".weight")
        tensors[name] = q
        tensors[f"{base}.weight_scale"] = scale
        tensors[f"{base}.input_scale"] = torch.tensor([0.05])
    for layer in range(3):
        for which in ("k_scale", "v_scale"):
            tensors[f"model.layers.{layer}.self_attn.{which}"] = torch.tensor(1.0)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    inputs = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}
    config = (
        _compressed_tensors_config(strategy, inputs)
        if method == "compressed-tensors"
        else {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": []}
    )
    ignore = [n for n in kept if n.endswith("proj")]
    config["ignore" if method == "compressed-tensors" else "ignored_layers"] += ignore
    _edit_config(out, quantization_config=config)
    return out


def _edit_config(model_dir: Path, **changes) -> None:
    path = model_dir / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _read(model_dir: Path):
    config, _ = read_config(model_dir)
    model = build_model(config, CPU, torch.float32, "fp8")
    load_checkpoint(model, model_dir)
    return model


def _stored(model_dir: Path, layer: int, fused: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused projection's float8 rows and per-row scales as the checkpoint holds them."""
    tensors = load_file(model_dir / "model.safetensors")
    where = "self_attn" if fused in ("qkv_proj", "o_proj") else "mlp"
    parts = SHARDS.get(fused, (fused,))
    names = [f"model.layers.{layer}.{where}.{p}" for p in parts]
    weight = torch.cat([tensors[f"{n}.weight"].float() for n in names])
    rows = [tensors[f"{n}.weight"].shape[0] for n in names]
    scales = torch.cat(
        [tensors[f"{n}.weight_scale"].reshape(-1).expand(r) for n, r in zip(names, rows, strict=True)]
    )
    return weight, scales


@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_a_compressed_tensors_checkpoint_is_read_as_stored(tmp_path, strategy) -> None:
    model_dir = _write_fp8(tmp_path, strategy)
    config, _ = read_config(model_dir)
    scheme = checkpoint_scheme(config)
    assert (scheme.method, scheme.weight_strategy, scheme.activations) == (
        "compressed-tensors",
        strategy,
        "static",
    )
    model = _read(model_dir)
    modules = fp8_modules(model)
    assert len(modules) == 3 * 4
    for layer in range(3):
        for fused in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            where = "self_attn" if fused in ("qkv_proj", "o_proj") else "mlp"
            module = modules[f"layers.{layer}.{where}.{fused}"]
            weight, scales = _stored(model_dir, layer, fused)
            assert torch.equal(module.weight.float(), weight)  # the float8 bytes as stored, never requantised
            assert torch.equal(module.weight_scale, scales)
            assert module.bias is not None and bool(module.bias.abs().sum() > 0)


def test_an_fp8_method_checkpoint_with_per_tensor_scales_is_read(tmp_path) -> None:
    model_dir = _write_fp8(tmp_path, "tensor", method="fp8")
    config, _ = read_config(model_dir)
    assert checkpoint_scheme(config).method == "fp8"
    model = _read(model_dir)
    weight, scales = _stored(model_dir, 1, "gate_up_proj")
    module = model.layers[1].mlp.gate_up_proj
    assert torch.equal(module.weight.float(), weight) and torch.equal(module.weight_scale, scales)
    assert len(set(scales[:128].tolist())) == 1 and scales[0] != scales[-1]  # gate's scale, then up's


def test_a_bf16_checkpoint_is_quantised_per_channel_at_load(tmp_path) -> None:
    out = tmp_path / "bf16"
    random_hf_model(tiny_config("llama-bias", 256, hidden=64, heads=4, kv_heads=2)).to(
        torch.bfloat16
    ).save_pretrained(out)
    model = _read(out)
    tensors = load_file(out / "model.safetensors")
    q = tensors["model.layers.2.self_attn.k_proj.weight"]
    module = model.layers[2].self_attn.qkv_proj
    expect_q, expect_s = quantize_weight(q)
    rows = slice(64, 96)  # k's rows of the fused q/k/v
    assert torch.equal(module.weight[rows].float(), expect_q.float())
    assert torch.equal(module.weight_scale[rows], expect_s)
    relative = (
        dequantize_rows(module.weight[rows], module.weight_scale[rows]) - q.float()
    ).norm() / q.float().norm()
    assert float(relative) < 0.04


def test_random_fp8_weights_are_quantised_gaussians() -> None:
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, initializer_range=0.02,
    )  # fmt: skip
    model = build_model(config, CPU, torch.float32, "fp8")
    init_random(model, seed=0)
    for module in fp8_modules(model).values():
        values = dequantize_rows(module.weight, module.weight_scale)
        assert 0.015 < float(values.std()) < 0.025
        assert isinstance(module, FP8Linear)


def test_an_fp8_checkpoint_is_refused_on_the_cpu_by_the_loader(tmp_path) -> None:
    model_dir = _write_fp8(tmp_path)
    with pytest.raises(UnsupportedDeviceError, match=r"compute capability >= 8\.9"):
        load_model(str(model_dir), CPU, torch.float32, random_weights=False)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"quant_method": "gptq", "bits": 4}, "quant_method 'gptq' is not supported"),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "block-wise FP8"),
        ({"quant_method": "fp8", "fmt": "e5m2"}, "format 'e5m2'"),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "strategy": "group"}}},
            },
            "weights (type='int', num_bits=4, strategy='group') are not supported",
        ),
        (
            _compressed_tensors_config("channel", {"num_bits": 8, "type": "int", "strategy": "token"}),
            "input activations",
        ),
        ({"quant_method": "compressed-tensors", "config_groups": {}}, "without config_groups"),
    ],
)
def test_unknown_schemes_are_refused_with_what_is_read(tmp_path, config, words) -> None:
    model_dir = _write_fp8(tmp_path)
    _edit_config(model_dir, quantization_config=config)
    parsed, _ = read_config(model_dir)
    with pytest.raises(UnsupportedArchitectureError, match=r"config\.json") as info:
        checkpoint_scheme(parsed, model_dir / "config.json")
    assert words in str(info.value)


def test_a_float8_weight_without_its_scale_is_a_checkpoint_error(tmp_path) -> None:
    model_dir = _write_fp8(tmp_path)
    tensors = load_file(model_dir / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight_scale"]
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        CheckpointError, match=r"do not pair up: \['layers\.1\.mlp\.gate_up_proj rows 128:256'\]"
    ):
        _read(model_dir)


def test_a_float8_tensor_for_a_full_precision_parameter_is_refused(tmp_path) -> None:
    model_dir = _write_fp8(tmp_path)
    tensors = load_file(model_dir / "model.safetensors")
    tensors["lm_head.weight"] = tensors["lm_head.weight"].to(torch.float8_e4m3fn)
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"lm_head\.weight is float8"):
        _read(model_dir)


@pytest.mark.parametrize("method", ["compressed-tensors", "fp8"])
def test_a_checkpoints_ignore_list_stays_in_full_precision(tmp_path, method) -> None:
    """Layer 2 stored in full precision and listed as ignored: it is read as stored, in the model
    dtype, not quantised at load; the other layers are FP8 as stored."""
    model_dir = _write_fp8(tmp_path, method=method, unquantised="model.layers.2.")
    model = _read(model_dir)
    assert set(fp8_modules(model)) == {f"layers.{i}.{m}" for i in (0, 1) for m in _PROJECTIONS}
    tensors = load_file(model_dir / "model.safetensors")
    qkv, down = model.layers[2].self_attn.qkv_proj, model.layers[2].mlp.down_proj
    assert not isinstance(qkv, FP8Linear) and qkv.weight.dtype == torch.float32
    k = tensors["model.layers.2.self_attn.k_proj.weight"]
    assert torch.equal(qkv.weight[64:96], k)  # k's rows, exactly as stored
    assert torch.equal(down.weight, tensors["model.layers.2.mlp.down_proj.weight"])


def test_a_fused_projection_ignored_in_part_is_refused(tmp_path) -> None:
    model_dir = _write_fp8(tmp_path, unquantised="model.layers.2.self_attn.q_proj")
    with pytest.raises(
        CheckpointError, match=r"model\.layers\.2\.self_attn\.q_proj left unquantised but not"
    ):
        _read(model_dir)
