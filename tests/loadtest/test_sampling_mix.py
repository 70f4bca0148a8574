"""The realistic sampling mix: its shares, and the forms each endpoint and the engine take."""

from __future__ import annotations

import numpy as np

from loadtest.client import apply_event, request_body
from loadtest.metrics import itls, tpot
from loadtest.records import RequestRecord
from loadtest.sampling_mix import RESPONSE_FORMAT, engine_fields, sampling_mix
from replica.sampling_params import SamplingParams


def _draws(count: int = 20000) -> list[dict]:
    rng = np.random.default_rng(7)
    return [sampling_mix(rng) for _ in range(count)]


def test_the_mix_asks_logprobs_two_answers_and_schemas_at_their_shares() -> None:
    draws = _draws()
    sampled = [d for d in draws if d["temperature"] > 0]
    logprobs = [d["top_logprobs"] for d in sampled if "top_logprobs" in d]
    assert 0.18 < len(logprobs) / len(sampled) < 0.22
    assert min(logprobs) == 1 and max(logprobs) == 20
    assert not any("top_logprobs" in d for d in draws if d["temperature"] == 0)
    assert 0.04 < sum(d.get("n", 1) == 2 for d in draws) / len(draws) < 0.06
    assert 0.04 < sum("response_format" in d for d in draws) / len(draws) < 0.06
    assert 0.18 < (len(draws) - len(sampled)) / len(draws) < 0.22  # greedy


def test_each_endpoint_asks_logprobs_its_own_way() -> None:
    fields = {"temperature": 0.7, "top_logprobs": 5, "n": 2, "response_format": RESPONSE_FORMAT}
    chat = request_body("chat", "m", "hi", 8, fields)
    assert chat["logprobs"] is True and chat["top_logprobs"] == 5 and chat["n"] == 2
    assert chat["response_format"] == RESPONSE_FORMAT
    completion = request_body("completions", "m", "hi", 8, fields)
    assert completion["logprobs"] == 5 and "top_logprobs" not in completion


def test_every_draw_is_a_valid_engine_request() -> None:
    for draw in _draws(2000):
        params = SamplingParams(max_tokens=16, **engine_fields(draw))
        assert params.logprobs == draw.get("top_logprobs")
        assert (params.grammar is not None) == ("response_format" in draw)


def test_two_answers_count_per_answer_in_tpot_and_itl() -> None:
    record = RequestRecord("r", "t", "interactive", 1.0, 0.0, 0.0)
    for at, index in ((1.0, 0), (1.0, 1), (2.0, 0), (2.0, 1), (3.0, 0), (3.0, 1)):
        apply_event(record, {"choices": [{"index": index, "delta": {"content": "x"}}]}, at)
    apply_event(record, {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6}}, 3.0)
    record.end = 3.0
    assert record.choices == 2 and itls(record) == [1.0, 1.0]
    assert tpot(record) == 1.0  # three tokens per answer over two seconds


def test_the_mix_without_schemas_is_the_same_draws_but_the_schemas() -> None:
    from loadtest.plan import SamplingDraw

    with_schemas = SamplingDraw("mix", np.random.default_rng(3))
    without = SamplingDraw("mix_without_schemas", np.random.default_rng(3))
    pairs = [(with_schemas.next(), without.next()) for _ in range(400)]
    assert any("response_format" in a for a, _ in pairs)
    assert not any("response_format" in b for _, b in pairs)
    assert all({k: v for k, v in a.items() if k != "response_format"} == b for a, b in pairs)
