"""fairlane's replica engine: continuous batching over a paged KV cache, async host/device overlap.

Imports only torch, transformers, numpy and the standard library, so it runs on the GPU image.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Loaded on first use (PEP 562): `replica.errors` and `replica.sampling_params` are read by the
# routers, which must not load torch just to name an engine error.
_WHERE = {
    "EngineConfig": "replica.config",
    "Engine": "replica.engine",
    "CheckpointError": "replica.errors",
    "DuplicateRequestError": "replica.errors",
    "EngineError": "replica.errors",
    "EngineStoppedError": "replica.errors",
    "InvalidRequestError": "replica.errors",
    "PromptTooLongError": "replica.errors",
    "RequestFailedError": "replica.errors",
    "UnknownModelError": "replica.errors",
    "UnsupportedArchitectureError": "replica.errors",
    "EngineStats": "replica.outputs",
    "RequestMetrics": "replica.outputs",
    "RequestOutput": "replica.outputs",
    "DEFAULT_MODEL": "replica.presets",
    "preset_names": "replica.presets",
    "SamplingParams": "replica.sampling_params",
}

if TYPE_CHECKING:
    from replica.config import EngineConfig
    from replica.engine import Engine
    from replica.errors import (
        CheckpointError,
        DuplicateRequestError,
        EngineError,
        EngineStoppedError,
        InvalidRequestError,
        PromptTooLongError,
        RequestFailedError,
        UnknownModelError,
        UnsupportedArchitectureError,
    )
    from replica.outputs import EngineStats, RequestMetrics, RequestOutput
    from replica.presets import DEFAULT_MODEL, preset_names
    from replica.sampling_params import SamplingParams


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'replica' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_MODEL",
    "CheckpointError",
    "DuplicateRequestError",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EngineStats",
    "EngineStoppedError",
    "InvalidRequestError",
    "PromptTooLongError",
    "RequestFailedError",
    "RequestMetrics",
    "RequestOutput",
    "SamplingParams",
    "UnknownModelError",
    "UnsupportedArchitectureError",
    "preset_names",
]
