"""The sampling settings of realistic traffic, one draw per request (DESIGN.md §7).

20% greedy; 80% sampled at temperature U(0.6, 1.0) with top-p U(0.9, 1.0), of which a quarter also
take top-k from {20, 50, 100}, a fifth one penalty (frequency or presence U(0.1, 0.5), or repetition
U(1.05, 1.2)), a tenth min-p 0.05 and a fifth top logprobs (1 to 20, as evaluation harnesses, agent
frameworks and RL pipelines ask); each sampled request carries its own seed. Beside those, 5% of
requests ask for two answers (`n` 2, sampled ones) and 5% for output matching a JSON schema
(`response_format`). The fields are the OpenAI API's and vLLM's extras, so any server that takes
vLLM's fields takes these bodies; `top_logprobs` is the neutral form the client writes per endpoint
(`request_body`). Numpy only: the engine's trace benchmark (`bench/engine_trace.py`) draws the same mix.
"""

from __future__ import annotations

import zlib

import numpy as np

GREEDY: dict = {"temperature": 0.0}
LOGPROBS_SHARE = 0.2  # of sampled requests
TWO_ANSWERS_SHARE = 0.05 / 0.8  # of sampled requests: 5% of all
SCHEMA_SHARE = 0.05  # of all requests
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
    "required": ["answer", "confidence"],
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA}}


def sampling_mix(rng: np.random.Generator) -> dict:
    """One request's sampling fields."""
    fields = _sampled(rng) if rng.random() >= 0.2 else dict(GREEDY)
    if rng.random() < SCHEMA_SHARE:
        fields["response_format"] = RESPONSE_FORMAT
    return fields


def _sampled(rng: np.random.Generator) -> dict:
    fields: dict = {
        "temperature": round(float(rng.uniform(0.6, 1.0)), 3),
        "top_p": round(float(rng.uniform(0.9, 1.0)), 3),
        "seed": int(rng.integers(2**31)),
    }
    if rng.random() < 0.25:
        fields["top_k"] = int(rng.choice([20, 50, 100]))
    if rng.random() < 0.2:
        kind = int(rng.integers(3))
        if kind == 0:
            fields["frequency_penalty"] = round(float(rng.uniform(0.1, 0.5)), 3)
        elif kind == 1:
            fields["presence_penalty"] = round(float(rng.uniform(0.1, 0.5)), 3)
        else:
            fields["repetition_penalty"] = round(float(rng.uniform(1.05, 1.2)), 3)
    if rng.random() < 0.1:
        fields["min_p"] = 0.05
    if rng.random() < LOGPROBS_SHARE:
        fields["top_logprobs"] = int(rng.integers(1, 21))
    if rng.random() < TWO_ANSWERS_SHARE:
        fields["n"] = 2
    return fields


def endpoint_fields(sampling: dict, endpoint: str) -> dict:
    """The mix's fields as an endpoint takes them: chat asks logprobs with `logprobs: true` and
    `top_logprobs: k`, completions with `logprobs: k`."""
    fields = dict(sampling)
    k = fields.pop("top_logprobs", None)
    if k is not None:
        fields.update({"logprobs": True, "top_logprobs": k} if endpoint == "chat" else {"logprobs": k})
    return fields


def engine_fields(sampling: dict) -> dict:
    """The mix's fields as the engine's SamplingParams takes them."""
    fields = dict(sampling)
    if "top_logprobs" in fields:
        fields["logprobs"] = fields.pop("top_logprobs")
    response_format = fields.pop("response_format", None)
    if response_format is not None:
        fields["grammar"] = {"kind": "json_schema", "schema": response_format["json_schema"]["schema"]}
    return fields


def sampling_rng(seed: int, tenant_id: str) -> np.random.Generator:
    """A tenant's own stream of sampling draws (apart from its arrivals and lengths)."""
    return np.random.default_rng([seed, zlib.crc32(tenant_id.encode()), 0x5A4D])
