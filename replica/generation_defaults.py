"""A checkpoint's `generation_config.json`: its end-of-sequence ids and recommended sampling values.

Llama 3 instruct models end a turn with <|eot_id|> (128009) while config.json names only
<|end_of_text|> (128001); the list of ids lives in the generation config, and an engine that reads
only config.json generates past the end of every answer. The sampling values (temperature, top_p,
...) are what the model's authors recommend; the engine applies none of them by itself (a request
says what it wants), it exposes them for the serving layer to use as defaults, as vLLM does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from replica.errors import CheckpointError, InvalidRequestError
from replica.sampling_params import SamplingParams

FILENAME = "generation_config.json"
MAX_EOS_IDS = 16  # the min_tokens ban buffer holds this many end ids per sequence (model_runner)

# generation_config key -> SamplingParams field. do_sample is not mapped: vLLM and the OpenAI API
# sample unless the request's temperature is 0, and so does this engine.
SAMPLING_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


@dataclass(frozen=True)
class GenerationDefaults:
    """What a checkpoint's generation config sets; None where it says nothing."""

    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    do_sample: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None

    def sampling_overrides(self) -> dict[str, float | int]:
        """The SamplingParams fields the checkpoint recommends (only those it sets), e.g. Llama 3.1
        instruct's {"temperature": 0.6, "top_p": 0.9}: `SamplingParams(**overrides, **request's)`."""
        values = {field: getattr(self, key) for key, field in SAMPLING_KEYS.items()}
        return {field: value for field, value in values.items() if value is not None}


def eos_list(value) -> tuple[int, ...]:
    """An `eos_token_id` entry (an int, a list of ints, or null) as a tuple."""
    if value is None:
        return ()
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    raise ValueError(f"eos_token_id must be an int or a list of ints, not {value!r}")


def read_generation_defaults(model_dir: Path) -> GenerationDefaults:
    """The directory's generation config; an empty one when it has no such file."""
    path = model_dir / FILENAME
    if not path.exists():
        return GenerationDefaults()
    try:
        raw = json.loads(path.read_text())
        defaults = _from_dict(raw)
        SamplingParams(**defaults.sampling_overrides())  # the engine would refuse them per request
    except (OSError, ValueError, TypeError, InvalidRequestError) as exc:
        raise CheckpointError(f"{path}: {exc}") from exc
    if len(defaults.eos_token_ids) > MAX_EOS_IDS:
        count = len(defaults.eos_token_ids)
        raise CheckpointError(f"{path}: {count} eos ids; the engine takes at most {MAX_EOS_IDS}")
    return defaults


def _from_dict(raw: dict) -> GenerationDefaults:
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    types = {"bos_token_id": int, "pad_token_id": int, "do_sample": bool, "top_k": int, "max_new_tokens": int}
    values: dict = {"eos_token_ids": eos_list(raw.get("eos_token_id"))}
    for field in fields(GenerationDefaults):
        if field.name == "eos_token_ids" or raw.get(field.name) is None:
            continue
        value = raw[field.name]
        kind = types.get(field.name, float)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{field.name} must be {kind.__name__}, not {value!r}")
        values[field.name] = value
    return GenerationDefaults(**values)
