"""Exception types raised by the engine. Callers map them to API errors (400 vs. 500)."""


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class InvalidRequestError(EngineError, ValueError):
    """The request itself is wrong (empty prompt, bad sampling parameters). Maps to HTTP 400."""


class PromptTooLongError(InvalidRequestError):
    """Prompt plus requested tokens do not fit the model's context."""


class UnknownModelError(EngineError, ValueError):
    """The model name is neither a preset nor a local model directory."""


class UnsupportedArchitectureError(UnknownModelError):
    """A model directory whose architecture (or a setting of it) the engine does not implement."""


class CheckpointError(UnknownModelError):
    """A model directory whose files are missing, unreadable or do not fit its config."""


class DuplicateRequestError(InvalidRequestError):
    """A request id is already in flight."""


class EngineStoppedError(EngineError):
    """The engine is not running (never started, or stopped)."""


class RequestFailedError(EngineError):
    """A step that included this request raised; the request is ended, the engine keeps serving."""


class AdapterError(InvalidRequestError):
    """A LoRA adapter that cannot be served: a bad directory, a rank above the limit, target modules
    or shapes that do not fit the base model, a feature the engine does not implement, or LoRA off."""


class UnknownAdapterError(InvalidRequestError):
    """A request names an adapter this replica has not registered (the edge answers 404)."""


class UnsupportedDeviceError(InvalidRequestError):
    """A setting this engine's device cannot run: FP8 (weights or KV cache) below compute capability 8.9."""
