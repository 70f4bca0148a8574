"""Reading FP8 checkpoints: which `quantization_config` schemes the engine takes, and the writer
that puts a checkpoint's projection tensors into the model's FP8 modules (replica/fp8_linear.py).

Taken (config.json `quantization_config`):
* `quant_method: "fp8"`: e4m3 weights with a per-tensor `weight_scale`; `activation_scheme` dynamic
  or static. Block-wise scales (`weight_block_size`, `weight_scale_inv`) are refused.
* `quant_method: "compressed-tensors"`: every config group's weights 8-bit floats with strategy
  "channel" or "tensor" (`weight_scale` [N, 1] or [1]); input activations absent, or 8-bit floats per
  token or per tensor, dynamic or static.
Any other method or scheme is refused (UnsupportedArchitectureError naming it).

The engine always quantises activations per token as they arrive: a checkpoint's static
`input_scale` (a calibrated per-tensor scale) is read and not used. KV-cache scales (`k_scale`,
`v_scale`, or one `kv_scale` for both, under `self_attn`, its `k_proj`/`v_proj` or `attn`) become the
layer's `kv_scales` (`KVScaleReader`), used when the cache is FP8 (replica/kv_quant.py); a per-head
scale is taken at its largest, so one per-tensor scale covers every head. A projection the
checkpoint left in full precision (its `ignore` list) stays so (replica/fp8_skip.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from replica.errors import CheckpointError, UnsupportedArchitectureError
from replica.fp8_linear import FP8Linear, fp8_modules
from replica.fp8_quant import FP8_DTYPE
from replica.kv_quant import KVScales

UNUSED_SCALES = ("input_scale", "k_scale", "v_scale", "kv_scale", "output_scale")
_FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}


@dataclass(frozen=True)
class Fp8Scheme:
    """What a checkpoint's quantization_config says, in the terms the engine uses."""

    method: str  # "fp8" or "compressed-tensors"
    weight_strategy: str  # "tensor" or "channel"
    activations: str  # "dynamic", "static" or "none" (weight-only): the engine quantises per token anyway


def checkpoint_scheme(config, where: Path | str = "config.json") -> Fp8Scheme | None:
    """The FP8 scheme of a transformers config's `quantization_config`; None when it has none."""
    qc = quantization_config(config)
    if qc is None:
        return None
    method = qc.get("quant_method")
    if method == "fp8":
        return _fp8_method(qc, where)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, where)
    raise UnsupportedArchitectureError(
        f"{where}: quantization_config quant_method {method!r} is not supported (the engine reads "
        "'fp8' and 'compressed-tensors' float8 checkpoints, or quantises bf16 weights at load)"
    )


def quantization_config(config) -> dict | None:
    """A transformers config's `quantization_config` as a dict (transformers may hold an object)."""
    raw = getattr(config, "quantization_config", None)
    if raw is None:
        return None
    return raw if isinstance(raw, dict) else getattr(raw, "to_dict", lambda: vars(raw))()


def _fp8_method(qc: dict, where) -> Fp8Scheme:
    if qc.get("weight_block_size"):
        raise UnsupportedArchitectureError(
            f"{where}: block-wise FP8 (weight_block_size {qc['weight_block_size']}) is not supported; "
            "per-tensor and per-channel scales are"
        )
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise UnsupportedArchitectureError(f"{where}: FP8 format {fmt!r} is not supported (e4m3 is)")
    activations = qc.get("activation_scheme", "dynamic")
    if activations not in ("dynamic", "static"):
        raise UnsupportedArchitectureError(f"{where}: activation_scheme {activations!r} is not supported")
    return Fp8Scheme("fp8", "tensor", activations)


def _compressed_tensors(qc: dict, where) -> Fp8Scheme:
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict) or not groups:
        raise UnsupportedArchitectureError(f"{where}: compressed-tensors config without config_groups")
    strategies, activations = set(), set()
    for name, group in groups.items():
        weights = (group or {}).get("weights") or {}
        if not _is_float8(weights) or weights.get("strategy") not in ("channel", "tensor"):
            raise UnsupportedArchitectureError(
                f"{where}: compressed-tensors group {name!r}: weights {_describe(weights)} are not supported "
                "(8-bit float weights with 'channel' or 'tensor' scales are)"
            )
        strategies.add(weights["strategy"])
        inputs = group.get("input_activations")
        if inputs is None:
            activations.add("none")
        elif _is_float8(inputs) and inputs.get("strategy") in ("token", "tensor"):
            activations.add("dynamic" if inputs.get("dynamic") else "static")
        else:
            raise UnsupportedArchitectureError(
                f"{where}: compressed-tensors group {name!r}: input activations {_describe(inputs)} are not "
                "supported (8-bit floats per token or per tensor are)"
            )
    strategy = "channel" if "channel" in strategies else "tensor"
    return Fp8Scheme("compressed-tensors", strategy, "/".join(sorted(activations)))


def _is_float8(args: dict) -> bool:
    return args.get("type") == "float" and args.get("num_bits") == 8


def _describe(args) -> str:
    if not isinstance(args, dict):
        return repr(args)
    keys = ("type", "num_bits", "strategy")
    return "(" + ", ".join(f"{k}={args.get(k)!r}" for k in keys) + ")"


class Fp8Writer:
    """Fills the FP8 modules from a checkpoint's tensors, in any order: a float8 weight waits for
    its `weight_scale` (or the scale for it); a full-precision weight is quantised at once."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.modules = fp8_modules(model)
        self._covered = {
            name: torch.zeros(m.out_features, dtype=torch.bool) for name, m in self.modules.items()
        }
        self._weights: dict[tuple[str, int, int], tuple[torch.Tensor, Path]] = {}
        self._scales: dict[tuple[str, int, int], tuple[torch.Tensor, Path]] = {}

    def takes(self, name: str) -> bool:
        """Whether `name` (our module name + leaf) is an FP8 module's weight or scale."""
        module, _, leaf = name.rpartition(".")
        return module in self.modules and (leaf in ("weight", "weight_scale") or leaf in UNUSED_SCALES)

    def put(self, name: str, rows: slice, tensor: torch.Tensor, path: Path) -> None:
        module_name, _, leaf = name.rpartition(".")
        module = self.modules[module_name]
        start, stop, _ = rows.indices(module.out_features)
        key = (module_name, start, stop)
        if leaf in UNUSED_SCALES:
            return
        if leaf == "weight_scale":
            self._scales[key] = (tensor, path)
        elif tensor.dtype in _FLOAT8:
            if tensor.dtype != FP8_DTYPE:
                raise CheckpointError(
                    f"{path}: {name} is {tensor.dtype}; only float8_e4m3fn weights are read"
                )
            self._check_shape(module, name, tensor, stop - start, path)
            self._weights[key] = (tensor, path)
        else:
            self._check_shape(module, name, tensor, stop - start, path)
            module.quantize_rows_from(tensor, slice(start, stop))
            self._covered[module_name][start:stop] = True
        if key in self._weights and key in self._scales:
            self._pair(module, key)

    def _pair(self, module: FP8Linear, key: tuple[str, int, int]) -> None:
        (weight, path), (scale, _) = self._weights.pop(key), self._scales.pop(key)
        try:
            module.set_rows(weight, scale, slice(key[1], key[2]))
        except ValueError as exc:
            raise CheckpointError(f"{path}: {key[0]} rows {key[1]}:{key[2]}: {exc}") from exc
        self._covered[key[0]][key[1] : key[2]] = True

    @staticmethod
    def _check_shape(module: FP8Linear, name: str, tensor: torch.Tensor, rows: int, path: Path) -> None:
        if tuple(tensor.shape) != (rows, module.in_features):
            raise CheckpointError(
                f"{path}: tensor for {name} has shape {tuple(tensor.shape)}, the config asks for "
                f"{(rows, module.in_features)}"
            )

    def check_complete(self, model_dir: Path) -> None:
        """Every FP8 module's every row written, and no weight or scale left without its partner."""
        if self._weights or self._scales:
            lone = [f"{k[0]} rows {k[1]}:{k[2]}" for k in [*self._weights, *self._scales]][:4]
            raise CheckpointError(
                f"{model_dir}: float8 weights and weight_scale tensors do not pair up: {lone}"
            )
        missing = [name for name, rows in self._covered.items() if not bool(rows.all())]
        if missing:
            raise CheckpointError(
                f"{model_dir}: the checkpoint lacks the weights of {len(missing)}: {missing[:4]}"
            )


# layers.N.self_attn[.k_proj|.v_proj|.attn].{k,v,kv}_scale (HF names without "model.")
_KV_SCALE = re.compile(r"^(layers\.\d+\.self_attn)\.(?:k_proj\.|v_proj\.|attn\.)?(k_scale|v_scale|kv_scale)$")


class KVScaleReader:
    """Collects a checkpoint's KV-cache scales per attention layer, then sets each layer's `kv_scales`."""

    def __init__(self) -> None:
        self._scales: dict[str, dict[str, float]] = {}

    def takes(self, name: str, tensor: torch.Tensor, path: Path) -> bool:
        """Records `name` if it is a KV-cache scale (and says so); anything else is left to the caller."""
        match = _KV_SCALE.match(name)
        if match is None:
            return False
        value = float(tensor.detach().to(torch.float32).max()) if tensor.numel() else float("nan")
        if not (math.isfinite(value) and value > 0.0):
            raise CheckpointError(f"{path}: {name} is not a positive finite KV-cache scale ({value})")
        parts = ("k", "v") if match.group(2) == "kv_scale" else (match.group(2)[0],)
        for part in parts:
            self._scales.setdefault(match.group(1), {})[part] = value
        return True

    def apply(self, model: torch.nn.Module, model_dir: Path) -> None:
        for module_name, scales in self._scales.items():
            try:
                attention = model.get_submodule(module_name)
            except AttributeError as exc:
                raise CheckpointError(
                    f"{model_dir}: KV-cache scales for {module_name}, which the model lacks"
                ) from exc
            attention.kv_scales = KVScales(scales.get("k", 1.0), scales.get("v", 1.0))
