"""The sampling settings of realistic traffic, one draw per request (DESIGN.md §7).

20% greedy; 80% sampled at temperature U(0.6, 1.0) with top-p U(0.9, 1.0), of which a quarter also
take top-k from {20, 50, 100}, a fifth one penalty (frequency or presence U(0.1, 0.5), or repetition
U(1.05, 1.2)) and a tenth min-p 0.05; each sampled request carries its own seed. The fields are the
OpenAI API's and vLLM's extras, so any server that takes vLLM's fields takes these bodies. Numpy
only: the engine's trace benchmark (`bench/engine_trace.py`) draws the same mix.
"""

from __future__ import annotations

import zlib

import numpy as np

GREEDY: dict = {"temperature": 0.0}


def sampling_mix(rng: np.random.Generator) -> dict:
    """One request's sampling fields."""
    if rng.random() < 0.2:
        return dict(GREEDY)
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
    return fields


def sampling_rng(seed: int, tenant_id: str) -> np.random.Generator:
    """A tenant's own stream of sampling draws (apart from its arrivals and lengths)."""
    return np.random.default_rng([seed, zlib.crc32(tenant_id.encode()), 0x5A4D])
