"""What each served model's replicas run on and with, in one line per model (``fairlane serve``)."""

from __future__ import annotations

import logging
from typing import Any

from ray import serve

from cluster.config import AppConfig
from cluster.model_settings import ModelSettings
from cluster.routing.room_follower import room_for

log = logging.getLogger(__name__)
INFO_TIMEOUT_S = 30.0


def engine_info(app_name: str, deployment: str) -> dict[str, Any] | None:
    """One replica's ``info()`` (device, dtype, sizes), or None when none answers in time."""
    try:
        handle = serve.get_deployment_handle(deployment, app_name)
        return handle.info.remote().result(timeout_s=INFO_TIMEOUT_S)
    except Exception as exc:  # no replica yet (autoscaled from zero), or it is restarting
        log.debug("replica info of %s not read: %s", deployment, exc)
        return None


def sizes_line(model: ModelSettings, info: dict[str, Any] | None) -> str:
    """``name: device dtype, N slots (chosen), K KV tokens, T tokens per step, room R per replica``."""
    if info is None:
        return f"{model.name}: no replica answered yet (its sizes show in /health once one runs)"
    chosen = set(info.get("chosen", ()))
    room, clamped = room_for(model.replica_room, info["max_num_seqs"])
    room_note = "the slots" if model.replica_room is None else "set"
    if clamped:
        room_note = f"set {model.replica_room}, clamped to the slots"
    return (
        f"{model.name}: {info['device']} {info['dtype']}{_kv_note(info)}, "
        f"{info['max_num_seqs']} slots{_mark('max_num_seqs', chosen)}, "
        f"{info['kv_tokens']:,} KV tokens{_mark('num_kv_blocks', chosen)}, "
        f"{info['max_num_batched_tokens']:,} tokens per step{_mark('max_num_batched_tokens', chosen)}, "
        f"context {info['max_model_len']:,}, room {room} per replica ({room_note})"
    )


def _kv_note(info: dict[str, Any]) -> str:
    """' with float8_e4m3fn KV' where the KV cache is not in the model dtype (kv_cache_dtype fp8)."""
    kv = info.get("kv_cache_dtype", info["dtype"])
    return "" if kv == info["dtype"] else f" with {kv} KV"


def _mark(field: str, chosen: set[str]) -> str:
    return " (chosen)" if field in chosen else ""


def sizes_lines(config: AppConfig, app_name: str) -> list[str]:
    return [sizes_line(m, engine_info(app_name, config.deployments[m.name])) for m in config.served_models]
