"""fairlane's replica engine: continuous batching over a paged KV cache, async host/device overlap.

Imports only torch, transformers, numpy and the standard library, so it runs on the GPU image.
"""

from replica.config import EngineConfig
from replica.engine import Engine
from replica.errors import (
    DuplicateRequestError,
    EngineError,
    EngineStoppedError,
    InvalidRequestError,
    PromptTooLongError,
    RequestFailedError,
    UnknownModelError,
)
from replica.outputs import EngineStats, RequestMetrics, RequestOutput
from replica.presets import DEFAULT_MODEL, preset_names
from replica.sampling_params import SamplingParams

__all__ = [
    "DEFAULT_MODEL",
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
    "preset_names",
]
