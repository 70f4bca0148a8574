"""What one served model is built with: its engine, replica count or autoscaling, resources and room.

An app serves one model (``AppConfig``'s top-level ``engine``, ``num_replicas``... and
``served_model_name``) or a list of them (``AppConfig.models``). Each list entry takes what it does
not give from the top level (``engine`` field by field), so the top level holds what the models
share. The entries are resolved when the config is validated: a validated entry holds every value,
and a config dumped and validated again (the routers get it so) resolves to the same models.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import PurePath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster.serving.sla_settings import SlaSettings

# Safe in a Redis key prefix (no braces: the tenants' hash tags), a metric label and a deployment name.
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$"
# The first model's replica deployment keeps the single-model name, so the drills, tools and tests
# that look the replicas up by it keep working, and adding a model does not redeploy the first one.
FIRST_DEPLOYMENT = "Replica"
# Top-level fields a `models` entry takes when it does not give its own.
INHERITED = ("replica_num_cpus", "replica_num_gpus", "replica_room", "tool_call_parser")
DEFAULT_MODEL = "smollm2-135m"  # EngineSettings.model's default (replica.presets.DEFAULT_MODEL)
# The most slots an engine chooses by itself (replica/engine_sizes.py's CUDA_MAX_SEQS; not imported:
# replica/ loads torch, which routers never do). It bounds Serve's ongoing requests per replica while
# the room follows the replicas' reports.
AUTO_MAX_SEQS = 128
PROVISIONAL_ROOM = 8  # a CPU engine's own slots: the room until the first replica reports its own
ROOM_NOTE = (
    "Requests in flight per replica at most; the rest wait in the router's fair queue. None: the "
    "engine's slots (max_num_seqs), as each replica reports them. Larger than max_num_seqs is refused "
    "(or, when the slots are chosen by the engine, clamped to them with a warning)."
)
# How a model writes tool calls (cluster/text/tool_parsers.py); auto: guessed from its chat template.
ToolCallParser = Literal["auto", "hermes", "llama3_json"]
TOOL_CALL_PARSER_NOTE = (
    "How the model writes tool calls: hermes (<tool_call> tags: Hermes, Qwen), llama3_json (Llama 3.1+ "
    "JSON), or auto (guessed from the chat template; hermes where it shows no tools)."
)


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineSettings(_Frozen):
    """What each replica's engine is built with (see ``replica.EngineConfig``)."""

    model: str = Field(
        default=DEFAULT_MODEL, description="Preset name or local Hugging Face model directory."
    )
    device: str = Field(default="auto", description="'auto' (CUDA when present), 'cpu' or 'cuda'.")
    mode: Literal["auto", "async", "sync"] = Field(
        default="auto", description="Engine step loop: async (overlapped), sync, or auto (async on CUDA)."
    )
    random_weights: bool = Field(
        default=False, description="Random weights of the preset's shape (benchmarks)."
    )
    synthetic_tokenizer: bool = Field(
        default=False,
        description="Generated word-level tokenizer of the preset's vocabulary (random-weight benchmarks).",
    )
    kv_cache_tokens: int = Field(default=16384, gt=0, description="KV cache size in tokens on CPU.")
    max_num_seqs: int | None = Field(
        default=None,
        gt=0,
        description="Sequences batched together per step, at most; None: chosen for the device "
        "(CPU 8; CUDA up to 128, as the KV pool allows: replica/engine_sizes.py).",
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Tokens per step (prefill chunking); None: chosen for the device (CPU 512, CUDA 2048).",
    )
    max_model_len: int | None = Field(default=None, gt=1, description="Context cap; None = the model's own.")
    enable_prefix_caching: bool = Field(
        default=True, description="Keep prompt KV blocks and find them again, per tenant (docs/engine.md)."
    )
    late_launch: bool | None = Field(
        default=False,
        description="Plan each step as the one on the device is about to end, so arrivals join it "
        "(docs/engine.md, measured: off by default); None: on with CUDA.",
    )
    quantization: Literal["fp8"] | None = Field(
        default=None,
        description="fp8: FP8 weights (per-channel scales) and activations (per token) in the "
        "projections; needs a GPU of compute capability >= 8.9 (docs/engine.md, FP8). None: the "
        "checkpoint's own (an FP8 checkpoint is served in FP8), else the model dtype.",
    )
    fp8_skip_modules: list[str] = Field(
        default_factory=list,
        description="With FP8: projections left in the model dtype, as Hugging Face module names or "
        "'re:' and a regular expression (compressed-tensors' ignore syntax), on top of the checkpoint's "
        "own list; a fused q/k/v or gate/up projection only as a whole (docs/engine.md, FP8).",
    )
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        default="auto",
        description="KV cache dtype: auto (the model dtype); fp8: e4m3 with a per-layer scale for K and "
        "for V, twice the KV blocks in the same memory; needs a GPU of compute capability >= 8.9 "
        "(docs/engine.md, FP8).",
    )
    lora_slots: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="LoRA adapters resident on the device at once (a fixed pool, least recently used "
        'evicted); 0 = LoRA off (no memory, no work). docs/engine.md, "Multi-LoRA".',
    )
    max_lora_rank: int = Field(default=16, ge=1, le=64, description="Rank every adapter slot is sized for.")
    lora_adapters: dict[str, str] = Field(
        default_factory=dict,
        description="Adapter name -> PEFT LoRA directory, registered at start. A request selects one with "
        "`model: <adapter name>`; tenancy's `adapters` says which tenants may. More are registered at run "
        "time with POST /admin/adapters.",
    )

    @model_validator(mode="after")
    def _adapters_need_slots(self) -> EngineSettings:
        if self.lora_adapters and self.lora_slots == 0:
            raise ValueError("lora_adapters needs lora_slots > 0 (LoRA is off with no slots)")
        for name in self.lora_adapters:
            if not re.match(MODEL_NAME_PATTERN, name):
                raise ValueError(f"lora_adapters: {name!r} is not a valid model name")
        return self


class AutoscalingSettings(_Frozen):
    """Serve autoscaling of the replica deployment; ``target_ongoing_requests`` should be below the room."""

    min_replicas: int = Field(default=1, ge=1, description="Replicas kept when idle.")
    max_replicas: int = Field(default=2, ge=1, description="Replicas at most.")
    initial_replicas: int | None = Field(
        default=None,
        ge=1,
        description="Replicas started with the app (warm for expected load); None = min_replicas.",
    )
    target_ongoing_requests: float = Field(
        default=2.0, gt=0, description="Ongoing requests per replica aimed at."
    )
    upscale_delay_s: float = Field(
        default=2.0, ge=0, description="Load must last this long before scaling up."
    )
    downscale_delay_s: float = Field(default=10.0, ge=0, description="Idle time before scaling down.")
    metrics_interval_s: float = Field(default=0.5, gt=0, description="How often replicas report their load.")
    policy: Literal["ongoing", "sla"] = Field(
        default="ongoing",
        description="ongoing: Serve's policy on ongoing requests (the engines' running + waiting with "
        "direct dispatch) at target_ongoing_requests; sla: predicted SLA attainment per class "
        "(cluster/serving/sla_policy.py, `sla` below; docs/cluster.md).",
    )
    sla: SlaSettings = Field(default_factory=SlaSettings, description="The SLA policy's settings.")

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSettings:
        check_scaling_bounds(self.min_replicas, self.max_replicas, self.initial_replicas, "replicas")
        return self


def check_scaling_bounds(least: int, most: int, initial: int | None, noun: str) -> None:
    """min ≤ max, and a given initial count between them (replicas' and routers' autoscaling)."""
    if most < least:
        raise ValueError(f"max_{noun} must be >= min_{noun}")
    if initial is not None and not least <= initial <= most:
        raise ValueError(f"initial_{noun} must lie between min_{noun} and max_{noun}")


class ModelSettings(_Frozen):
    """One served model: its API name and its own replica pool. Unset fields come from the top level."""

    name: str = Field(
        pattern=MODEL_NAME_PATTERN,
        description="Model name in the API: the request's `model` field. Unset: the engine.model's own "
        "name (the preset's, or the checkpoint directory's).",
    )
    engine: EngineSettings = Field(
        default_factory=EngineSettings,
        description="Engine settings; the fields given replace the top-level engine's, one by one.",
    )
    num_replicas: int = Field(default=1, ge=1, description="Fixed replica count (ignored with autoscaling).")
    autoscaling: AutoscalingSettings | None = Field(
        default=None, description="Autoscale this model's replicas instead of a fixed count."
    )
    replica_num_cpus: float = Field(default=1.0, ge=0, description="Ray CPUs reserved per replica.")
    replica_num_gpus: float | None = Field(
        default=None, ge=0, description="GPUs per replica; None = 1 when CUDA is present, else 0."
    )
    replica_room: int | None = Field(default=None, ge=1, description=ROOM_NOTE)
    tool_call_parser: ToolCallParser = Field(default="auto", description=TOOL_CALL_PARSER_NOTE)

    @model_validator(mode="after")
    def _room_fits(self) -> ModelSettings:
        check_room(self.replica_room, self.engine.max_num_seqs)
        return self

    @property
    def min_replicas(self) -> int:
        return self.autoscaling.min_replicas if self.autoscaling else self.num_replicas

    @property
    def room_hint(self) -> int:
        """The room per replica until a replica reports its slots: the room set, else the slots set,
        else a CPU engine's slots (the routers then follow what the replicas report)."""
        return self.replica_room or self.engine.max_num_seqs or PROVISIONAL_ROOM

    @property
    def replica_max_ongoing(self) -> int:
        # Headroom over the room: the requests the routers send past it for a higher tier
        # (cluster/routing/dispatcher.py, displacing dispatch), and cheap control calls (load, profile).
        room = self.replica_room or self.engine.max_num_seqs or AUTO_MAX_SEQS
        return room + max(1, room // 4) + 8


def check_room(room: int | None, slots: int | None) -> None:
    """A room set above the engine's slots set would queue requests inside the replica, in arrival
    order, where the router's fair queue should hold them: refused at start."""
    if room is not None and slots is not None and room > slots:
        raise ValueError(
            f"replica_room ({room}) is larger than engine.max_num_seqs ({slots}): requests past the "
            "slots would wait inside the replica instead of the fair queue. Set replica_room at most "
            "max_num_seqs, or leave it unset to follow the slots."
        )


def model_name_of(model: str) -> str:
    """The API name of a model given by preset or directory: the preset's name, or the directory's
    own (its last part), with any character a model name may not hold replaced by '-'."""
    name = PurePath(os.path.abspath(os.path.expanduser(model))).name  # "." and "~/m" name their folders
    name = re.sub(r"[^A-Za-z0-9._:@+-]", "-", name).lstrip("._:@+-")[:128]
    return name or "model"


def inherit_entries(data: Mapping[str, Any]) -> dict[str, Any]:
    """The raw app config with each ``models`` entry completed from the top level (before validation).

    Scaling goes as a pair: an entry that gives ``num_replicas`` or ``autoscaling`` takes neither from
    the top level (a fixed count given alone means no autoscaling).
    """
    top = dict(data)
    entries = top.get("models")
    if not isinstance(entries, Sequence) or isinstance(entries, str):
        return top
    top["models"] = [_inherit(_given(entry), top) for entry in entries]
    return top


def _inherit(entry: Any, top: Mapping[str, Any]) -> Any:
    if not isinstance(entry, dict):
        return entry  # not a mapping: validation names the problem
    out = dict(entry)
    engine = _given(top.get("engine") or {})
    if isinstance(engine, dict):
        out["engine"] = {**engine, **_given(entry.get("engine") or {})}
    if "num_replicas" not in entry and "autoscaling" not in entry:
        for key in ("num_replicas", "autoscaling"):
            if key in top:
                out[key] = top[key]
    for key in INHERITED:
        if key not in entry and key in top:
            out[key] = top[key]
    model = out.get("engine", {}).get("model") if isinstance(out.get("engine"), dict) else None
    if "name" not in out and (model is None or isinstance(model, str)):
        out["name"] = model_name_of(model or DEFAULT_MODEL)
    return out


def _given(value: Any) -> Any:
    """A model's fields as given (not its defaults), or the value as it is."""
    return value.model_dump(exclude_unset=True) if isinstance(value, BaseModel) else value


def deployment_names(models: Sequence[ModelSettings]) -> dict[str, str]:
    """Served name -> its replica deployment: ``Replica`` for the first, ``Replica-<name>`` after."""
    out: dict[str, str] = {}
    for index, model in enumerate(models):
        out[model.name] = FIRST_DEPLOYMENT if index == 0 else f"{FIRST_DEPLOYMENT}-{_safe(model.name)}"
    return out


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def check_unique(models: Sequence[ModelSettings]) -> None:
    """Served names, and the deployment names made from them, are unique; ValueError names the entry."""
    seen: dict[str, int] = {}
    for index, model in enumerate(models):
        if model.name in seen:
            raise ValueError(f"models.{index}.name: duplicate model name {model.name!r}")
        seen[model.name] = index
    deployments: dict[str, str] = {}
    for name, deployment in deployment_names(models).items():
        if deployment in deployments:
            other = deployments[deployment]
            raise ValueError(f"models: {name!r} and {other!r} make the same deployment name {deployment!r}")
        deployments[deployment] = name
    check_adapter_names(models)


def check_adapter_names(models: Sequence[ModelSettings]) -> None:
    """An adapter is served under its own name: it may be neither a model's name nor another adapter's."""
    names = {model.name for model in models}
    owner: dict[str, str] = {}
    for model in models:
        for adapter in model.engine.lora_adapters:
            if adapter in names:
                raise ValueError(f"lora_adapters: {adapter!r} is also a served model's name")
            if adapter in owner:
                raise ValueError(
                    f"lora_adapters: {adapter!r} is named by {owner[adapter]!r} and {model.name!r}"
                )
            owner[adapter] = model.name
