"""A PEFT LoRA adapter read from its directory and checked against the base model.

A directory holds adapter_config.json and adapter_model.safetensors (or adapter_model.bin). Each
targeted linear `W` of the base model gets `W x + s · B (A x)` with A [r, in], B [out, r] and
s = lora_alpha / r (lora_alpha / √r with `use_rslora`). The engine implements exactly that on the
seven projections of the Llama block (q, k, v, o, gate, up, down); anything an adapter could add on
top of it (DoRA's magnitudes, LoRA biases, modules saved whole, embedding or head targets, per-module
ranks) is refused here, at registration, naming the setting: served silently without it, the
adapter would give wrong tokens, not an error.

Weights are read into float32 with the scaling folded into B; `lora_layout.pack` turns them into one
slot's flat buffer in the model's dtype, and the registry keeps that image only.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from replica.errors import AdapterError

MAX_RANK = 64
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Settings with no effect on inference (training, initialisation, bookkeeping), or whose effect the
# tensors themselves show (which layers and modules carry weights): read, never refused.
_INFORMATIONAL = {
    "auto_mapping", "base_model_name_or_path", "revision", "task_type", "inference_mode",
    "init_lora_weights", "lora_dropout", "fan_in_fan_out", "megatron_core", "megatron_config",
    "qalora_group_size", "peft_version", "layers_pattern", "layers_to_transform", "exclude_modules",
    "target_modules", "loftq_config", "eva_config", "corda_config", "lora_ga_config",
    "ensure_weight_tying", "r", "lora_alpha", "use_rslora", "peft_type", "bias",
}  # fmt: skip
_TENSOR = re.compile(
    r"^(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.[^.]+)?\.weight$"
)
_uids = itertools.count(1)


@dataclass(frozen=True)
class ModuleShapes:
    """The base model's side of an adapter: its layers and each projection's (in, out) features."""

    num_layers: int
    features: dict[str, tuple[int, int]]

    @classmethod
    def of(cls, cfg, head_dim: int) -> ModuleShapes:
        hidden, inter = cfg.hidden_size, cfg.intermediate_size
        q, kv = cfg.num_attention_heads * head_dim, cfg.num_key_value_heads * head_dim
        features = {
            "q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden),
        }  # fmt: skip
        return cls(cfg.num_hidden_layers, features)


@dataclass(eq=False)
class LoraAdapter:
    """One registered adapter: its host weights, (A [r, in], s·B [out, r]) per (layer, module)."""

    name: str
    path: str
    rank: int
    scaling: float
    targets: tuple[str, ...]  # HF module names that carry weights, in TARGETS order
    digest: str  # of the weights file: the prefix cache keys and the routers name the adapter by it
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]  # emptied once packed (registry)
    uid: int = field(default_factory=lambda: next(_uids))  # this registration (a name may come back)
    packed: torch.Tensor | None = None  # the slot image (lora_layout.pack), set by the registry
    removed: bool = False  # unregistered: requests that hold it finish, its slot goes first

    @property
    def cache_key(self) -> str:
        return f"lora:{self.name}:{self.digest}"


def read_adapter(name: str, path: str, shapes: ModuleShapes, max_rank: int) -> LoraAdapter:
    """Read and check the adapter in `path`; AdapterError names what is wrong."""
    where = Path(path).expanduser()
    if not where.is_dir():
        raise AdapterError(f"adapter {name!r}: {path} is not a directory")
    config = _read_config(where)
    rank, scaling = _rank_and_scaling(config, where, max_rank)
    raw, digest = _read_tensors(where)
    weights = _pair_up(raw, shapes, rank, scaling, where)
    targets = tuple(t for t in TARGETS if any(m == t for _, m in weights))
    declared = config.get("target_modules")
    if isinstance(declared, list) and set(targets) - set(declared):
        raise AdapterError(
            f"{where}: tensors for {sorted(set(targets) - set(declared))} not in target_modules"
        )
    return LoraAdapter(name, str(where), rank, scaling, targets, digest, weights)


def _read_config(where: Path) -> dict:
    path = where / "adapter_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{path}: missing or not JSON ({exc})") from exc
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{path}: not a LoRA adapter (peft_type {config.get('peft_type')!r})")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{path}: bias {config['bias']!r} is not supported (only 'none')")
    for key, value in config.items():
        if key not in _INFORMATIONAL and value not in (None, False, {}, [], "", 0):
            raise AdapterError(f"{path}: {key}={value!r} is not supported")
    targets = config.get("target_modules")
    if isinstance(targets, list) and set(targets) - set(TARGETS):
        bad = sorted(set(targets) - set(TARGETS))
        raise AdapterError(f"{path}: target modules {bad} are not supported (only {', '.join(TARGETS)})")
    return config


def _rank_and_scaling(config: dict, where: Path, max_rank: int) -> tuple[int, float]:
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or rank <= 0 or not isinstance(alpha, int | float):
        raise AdapterError(f"{where}: r must be a positive integer and lora_alpha a number")
    if rank > min(max_rank, MAX_RANK):
        raise AdapterError(f"{where}: rank {rank} is above this replica's max_lora_rank {max_rank}")
    scaling = alpha / rank**0.5 if config.get("use_rslora") else alpha / rank
    return rank, float(scaling)


def _read_tensors(where: Path) -> tuple[dict[str, torch.Tensor], str]:
    st, binary = where / "adapter_model.safetensors", where / "adapter_model.bin"
    path = st if st.exists() else binary
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise AdapterError(f"{where}: no adapter_model.safetensors or adapter_model.bin ({exc})") from exc
    digest = hashlib.blake2b(data, digest_size=8).hexdigest()
    try:
        if path is st:
            from safetensors.torch import load as load_safetensors

            tensors = load_safetensors(data)
        else:
            import io

            tensors = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or corrupt file: whatever the reader raises
        raise AdapterError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from exc
    if not isinstance(tensors, dict) or not all(isinstance(t, torch.Tensor) for t in tensors.values()):
        raise AdapterError(f"{path}: not a mapping of tensors")
    return tensors, digest


def _pair_up(
    raw: dict[str, torch.Tensor], shapes: ModuleShapes, rank: int, scaling: float, where: Path
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in raw.items():
        match = _TENSOR.match(key)
        if match is None:
            raise AdapterError(f"{where}: tensor {key} is not a LoRA A/B of a supported projection")
        layer, module, half = int(match.group(1)), match.group(3), match.group(4)
        if module not in TARGETS:
            raise AdapterError(f"{where}: {key}: target module {module!r} is not supported")
        if layer >= shapes.num_layers:
            raise AdapterError(f"{where}: {key}: the base model has {shapes.num_layers} layers")
        halves.setdefault((layer, module), {})[half] = tensor
    if not halves:
        raise AdapterError(f"{where}: the weights file holds no LoRA tensors")
    return {at: _check_pair(at, pair, shapes, rank, scaling, where) for at, pair in sorted(halves.items())}


def _check_pair(at, pair, shapes: ModuleShapes, rank: int, scaling: float, where: Path):
    layer, module = at
    if set(pair) != {"A", "B"}:
        raise AdapterError(f"{where}: layer {layer} {module} has lora_{''.join(pair)} without its pair")
    a, b = pair["A"], pair["B"]
    fan_in, fan_out = shapes.features[module]
    if tuple(a.shape) != (rank, fan_in) or tuple(b.shape) != (fan_out, rank):
        raise AdapterError(
            f"{where}: layer {layer} {module}: A {tuple(a.shape)} and B {tuple(b.shape)} do not fit the "
            f"base model (expected A ({rank}, {fan_in}) and B ({fan_out}, {rank})): an adapter for "
            "another base model or shape"
        )
    a, b = a.float(), b.float() * scaling
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise AdapterError(f"{where}: layer {layer} {module} holds non-finite values")
    return a.contiguous(), b.contiguous()
