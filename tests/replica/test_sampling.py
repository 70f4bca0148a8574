"""The sampler: draws follow the analytic distribution of every filter, the chain finds the right
winner, noise is a pure function of seed and position, and bad parameters are refused."""

from __future__ import annotations

import pytest
import torch

from replica import InvalidRequestError, SamplingParams
from replica.sampler import SamplingTensors, exponential_noise, mix_seed, sample, sample_reference

P_VALUE_FLOOR = 1e-4  # a correct sampler fails one of these chi-square tests about once in 10,000 runs


def _tensors(n, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, position=None) -> SamplingTensors:
    return SamplingTensors(
        temperature=torch.full((n,), float(temperature)),
        top_k=torch.full((n,), top_k, dtype=torch.int64),
        top_p=torch.full((n,), float(top_p)),
        min_p=torch.full((n,), float(min_p)),
        seed=torch.full((n,), seed, dtype=torch.int64),
        position=torch.arange(n, dtype=torch.int64) if position is None else position,
    )


def allowed_distribution(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float):
    """The documented target, computed from its definition (sorting is fine here): tempered softmax,
    then tokens with fewer than top_k strictly more likely tokens, whose strictly-more-likely mass is
    below top_p, and whose probability is at least min_p x the largest; renormalised."""
    p = torch.softmax(logits.double() / temperature, dim=-1)
    greater = p[None, :] > p[:, None]  # [i, j]: j strictly more likely than i
    count, mass = greater.sum(dim=1), (greater * p[None, :]).sum(dim=1)
    keep = mass < top_p
    if top_k:
        keep &= count < top_k
    keep &= p >= min_p * p.max()
    target = torch.where(keep, p, 0.0)
    return target / target.sum()


def chi_square_p_value(counts: torch.Tensor, expected_probs: torch.Tensor) -> float:
    n = counts.sum()
    support = expected_probs > 0
    assert counts[~support].sum() == 0, "a filtered-out token was drawn"
    expected = expected_probs[support] * n
    stat = ((counts[support] - expected) ** 2 / expected).sum()
    df = int(support.sum()) - 1
    if df == 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2.0))


LOGITS = torch.tensor([2.0, 1.5, 1.2, 0.7, 0.3, 0.0, -0.4, -1.0, -1.5, -2.5])


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "min_p"),
    [
        (1.0, 0, 1.0, 0.0),
        (0.6, 0, 1.0, 0.0),
        (1.7, 0, 1.0, 0.0),
        (1.0, 4, 1.0, 0.0),
        (0.8, 0, 0.7, 0.0),
        (1.0, 0, 1.0, 0.15),
        (0.9, 6, 0.85, 0.05),  # all three together: their intersection
    ],
)
def test_draws_match_the_analytic_distribution(temperature, top_k, top_p, min_p):
    n = 40000
    logits = LOGITS.expand(n, -1).contiguous()
    ids = sample(logits, _tensors(n, temperature, top_k, top_p, min_p, seed=11))
    counts = torch.bincount(ids, minlength=len(LOGITS)).double()
    target = allowed_distribution(LOGITS, temperature, top_k, top_p, min_p)
    assert chi_square_p_value(counts, target) > P_VALUE_FLOOR, (counts / n, target)


def test_top_k_and_top_p_keep_only_the_head():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(4000, -1).contiguous()
    assert set(sample(logits, _tensors(4000, top_k=2)).tolist()) == {0, 1}
    # top_p 0.7: 0.5 alone is short of 0.7, 0.5 + 0.3 reaches it, so exactly tokens 0 and 1 remain.
    assert set(sample(logits, _tensors(4000, top_p=0.7)).tolist()) == {0, 1}
    assert set(sample(logits, _tensors(4000, top_p=0.4)).tolist()) == {0}
    # min_p 0.5: tokens at least half as likely as the best (0.3 >= 0.25; 0.15 is not).
    assert set(sample(logits, _tensors(4000, min_p=0.5)).tolist()) == {0, 1}


def test_the_chain_finds_the_race_winner_inside_the_allowed_set():
    """The chain's answer equals the exponential race restricted to the allowed set, computed
    directly: on random rows of a larger vocabulary, flat and peaked, with random filters."""
    g = torch.Generator().manual_seed(5)
    rows, vocab = 400, 300
    logits = torch.randn(rows, vocab, generator=g) * torch.rand(rows, 1, generator=g) * 6
    params = SamplingTensors(
        temperature=torch.rand(rows, generator=g) * 1.5 + 0.05,
        top_k=torch.randint(0, 40, (rows,), generator=g) * (torch.rand(rows, generator=g) < 0.5),
        top_p=torch.where(torch.rand(rows, generator=g) < 0.5, torch.rand(rows, generator=g), 1.0).clamp(
            0.05
        ),
        min_p=torch.where(torch.rand(rows, generator=g) < 0.3, torch.rand(rows, generator=g) * 0.3, 0.0),
        seed=torch.randint(0, 2**32, (rows,), generator=g),
        position=torch.randint(0, 4000, (rows,), generator=g),
    )
    got = sample_reference(logits, params)
    keys = logits / params.temperature[:, None] - torch.log(
        exponential_noise(params.seed, params.position, vocab)
    )
    for r in range(rows):
        k = int(params.top_k[r])
        if k == 1:
            assert got[r] == logits[r].argmax()
            continue
        allowed = allowed_distribution(
            logits[r], float(params.temperature[r]), k, float(params.top_p[r]), float(params.min_p[r])
        )
        expected = torch.where(allowed > 0, keys[r], float("-inf")).argmax()
        assert got[r] == expected, r


def test_greedy_rows_take_the_argmax_and_never_nan():
    logits = torch.randn(6, 50)
    logits[2, 7] = float("nan")
    logits[2, 9] = 40.0
    params = _tensors(6, temperature=0.0)
    params.top_k[5] = 1  # top_k 1 is greedy at any temperature
    params.temperature[5] = 1.3
    got = sample(logits, params)
    assert got[2] == 9
    assert torch.equal(got[[0, 1, 3, 4, 5]], logits[[0, 1, 3, 4, 5]].argmax(dim=-1))


def test_noise_is_a_pure_function_of_seed_and_position():
    a = exponential_noise(torch.tensor([7, 7, 8]), torch.tensor([3, 4, 3]), 1000)
    b = exponential_noise(torch.tensor([8, 7]), torch.tensor([3, 3]), 1000)
    assert torch.equal(a[0], b[1]) and torch.equal(a[2], b[0])
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], a[2])
    assert (a > 0).all() and torch.isfinite(a).all()


def test_parallel_samples_get_distinct_seeds():
    seeds = {mix_seed(1234, i) for i in range(64)}
    assert len(seeds) == 64 and mix_seed(1234, 0) == 1234


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0},
        {"max_tokens": -3},
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"top_p": 0.0},
        {"top_k": -1},
        {"min_p": 1.5},
        {"stop": [""]},
        {"n": 0},
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3.0},
        {"repetition_penalty": 0.0},
        {"logit_bias": {"5": 101.0}},
        {"logit_bias": {"x": 1.0}},
        {"logit_bias": {i: 1.0 for i in range(301)}},
        {"logprobs": 21},
        {"min_tokens": 20, "max_tokens": 10},
        {"stop_token_ids": list(range(17))},
    ],
)
def test_bad_sampling_params_are_rejected(kwargs):
    with pytest.raises(InvalidRequestError):
        SamplingParams(**kwargs)


def test_prompt_scoring_alone_may_ask_for_no_tokens():
    assert SamplingParams(max_tokens=0, prompt_logprobs=1).max_tokens == 0
    assert SamplingParams(logit_bias={"17": -100}).logit_bias == ((17, -100.0),)
