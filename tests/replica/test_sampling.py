"""Sampling: seeds reproduce outputs under any batch, filters behave, draws follow the distribution."""

from __future__ import annotations

import asyncio

import pytest
import torch

from replica import InvalidRequestError, SamplingParams
from replica.sampler import SamplingTensors, exponential_noise, sample
from tests.replica.conftest import collect

PROMPT_TEXT = "Write a short poem about the sea."


def _tensors(n, temperature=1.0, top_k=0, top_p=1.0, seed=0, position=None) -> SamplingTensors:
    return SamplingTensors(
        temperature=torch.full((n,), temperature),
        top_k=torch.full((n,), top_k, dtype=torch.int64),
        top_p=torch.full((n,), top_p),
        seed=torch.full((n,), seed, dtype=torch.int64),
        position=torch.arange(n, dtype=torch.int64) if position is None else position,
        all_greedy=temperature == 0,
        any_top_k=top_k > 0,
        any_top_p=top_p < 1,
    )


def test_draws_follow_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    n = 20000
    logits = probs.log().expand(n, -1).contiguous()
    ids = sample(logits, _tensors(n))
    freq = torch.bincount(ids, minlength=4).float() / n
    assert torch.allclose(freq, probs, atol=0.015), freq


def test_top_k_and_top_p_keep_only_the_head():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(4000, -1).contiguous()
    assert set(sample(logits, _tensors(4000, top_k=2)).tolist()) == {0, 1}
    # top_p 0.7: 0.5 alone is short of 0.7, 0.5 + 0.3 reaches it, so exactly tokens 0 and 1 remain.
    assert set(sample(logits, _tensors(4000, top_p=0.7)).tolist()) == {0, 1}
    assert set(sample(logits, _tensors(4000, top_p=0.4)).tolist()) == {0}


def test_noise_is_a_pure_function_of_seed_and_position():
    a = exponential_noise(torch.tensor([7, 7, 8]), torch.tensor([3, 4, 3]), 1000)
    b = exponential_noise(torch.tensor([8, 7]), torch.tensor([3, 3]), 1000)
    assert torch.equal(a[0], b[1]) and torch.equal(a[2], b[0])
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], a[2])
    assert (a > 0).all() and torch.isfinite(a).all()


async def test_same_seed_same_output_under_any_batch(engine):
    prompt = engine.apply_chat_template([{"role": "user", "content": PROMPT_TEXT}])
    params = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=1234)
    alone, _, _ = await collect(engine, prompt, params)
    noise = [
        collect(engine, prompt, SamplingParams(max_tokens=24, temperature=1.0, seed=i)) for i in range(6)
    ]
    results = await asyncio.gather(collect(engine, prompt, params), *noise)
    assert results[0][0] == alone
    others = {tuple(r[0]) for r in results[1:]}
    assert len(others) > 1, "different seeds should give different samples"


async def test_top_k_one_is_greedy(engine):
    prompt = engine.apply_chat_template([{"role": "user", "content": PROMPT_TEXT}])
    greedy, _, _ = await collect(engine, prompt, SamplingParams(max_tokens=16, temperature=0.0))
    top1, _, _ = await collect(
        engine, prompt, SamplingParams(max_tokens=16, temperature=1.5, top_k=1, seed=5)
    )
    assert top1 == greedy


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0},
        {"max_tokens": -3},
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"top_k": -1},
        {"stop": [""]},
    ],
)
def test_bad_sampling_params_are_rejected(kwargs):
    with pytest.raises(InvalidRequestError):
        SamplingParams(**kwargs)
