"""Batched sampling on the device, one fixed sequence of launches for any mix of rows.

Every row carries its own parameters in device tensors (filled by the step's one H2D copy), so a
step of greedy, tempered, filtered and penalised rows is one graphable program with no host sync.

The draw is an exponential race: with E_i ~ Exp(1), argmax_i p_i / E_i draws from p. E comes from a
counter-based hash of (request seed, output index, token id), so a token depends only on its
request's seed and position, never on the batch it ran in or on a preemption.

Filters without a sort. top-k, top-p and min-p are taken jointly on the tempered distribution
(as SGLang's "joint" order): token i is allowed when fewer than k tokens are strictly more likely,
their mass is below top_p, and p_i >= min_p * max p. The allowed set is an upper set of the
distribution, so the race's winner inside it is found by a chain: take the winner over all tokens;
if it is not allowed, take the winner among the tokens strictly more likely than it, and again.
Each link is one pass over the row and ends at the allowed winner (the most likely token is
always allowed); a typical top-p draw lands inside at the first try. `sample_reference` runs that
chain with torch ops (the CPU path); `replica/triton_sampler.py` runs it in one program per row.
"""

from __future__ import annotations

import torch

from replica.sampling_tensors import MAX_CHAIN, SamplingTensors

_MASK32 = 0xFFFFFFFF
BELOW_ONE = 1.0 - 2.0**-24  # the largest float32 below 1


def sample(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """One token id per row of processed float32 logits [S, vocab]."""
    if logits.is_cuda:
        from replica.triton_sampler import sample_rows

        return sample_rows(logits, params)
    return sample_reference(logits, params)


def sample_reference(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """The chain with torch ops (module docstring); the CPU path and the kernel's reference."""
    logits = torch.where(torch.isnan(logits), float("-inf"), logits)
    greedy = logits.argmax(dim=-1)
    greedy_rows = (params.temperature == 0) | (params.top_k == 1)
    if bool(greedy_rows.all()):
        return greedy
    vocab = logits.shape[-1]
    temperature = torch.where(greedy_rows, 1.0, params.temperature)
    v = logits / temperature[:, None]
    top = v.max(dim=-1, keepdim=True).values
    weight = torch.exp(v - top)  # unnormalised probabilities
    total = weight.sum(dim=-1)
    keys = v - torch.log(exponential_noise(params.seed, params.position, vocab))
    floor = torch.where(params.min_p > 0, top[:, 0] + torch.log(params.min_p), float("-inf"))
    k_on = (params.top_k > 0) & (params.top_k < vocab)
    pending = (k_on | (params.top_p < 1) | (params.min_p > 0)) & ~greedy_rows
    winner = keys.argmax(dim=-1)
    for _ in range(MAX_CHAIN):
        if not bool(pending.any()):
            break
        at = v.gather(1, winner[:, None])
        above = v > at
        allowed = (
            (at[:, 0] >= floor)
            & (~k_on | (above.sum(dim=-1) < params.top_k))
            & ((weight * above).sum(dim=-1) < params.top_p * total)
        )
        nxt = torch.where(above & (v >= floor[:, None]), keys, float("-inf")).argmax(dim=-1)
        winner = torch.where(pending & ~allowed, nxt, winner)
        pending &= ~allowed
    return torch.where(greedy_rows, greedy, winner)


def greedy_pick(logits: torch.Tensor) -> torch.Tensor:
    """argmax per row; on CUDA the kernel the all-greedy steps use (replica/triton_greedy.py), so a
    greedy row picks alike whatever its batch (the two differ only on NaN, which it never picks)."""
    if logits.is_cuda:
        from replica.triton_greedy import greedy_tokens

        return greedy_tokens(logits)
    return logits.argmax(dim=-1)


def exponential_noise(seed: torch.Tensor, position: torch.Tensor, vocab: int) -> torch.Tensor:
    """Exp(1) noise [S, vocab], a pure function of (seed, position, token id)."""
    token = torch.arange(vocab, device=seed.device, dtype=torch.int64)[None, :]
    key = row_key(seed, position)[:, None]
    bits = _mix32(_mix32(key ^ token * 0x85EBCA77) + key)
    return -torch.log(uniform_from_bits(bits))


def uniform_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """A float32 in (0, 1) from the top 24 of 32 hash bits. The top value, (2**24 - 0.5) / 2**24, rounds
    to 1.0 in float32, which gave E = 0: that token's key became +inf (it won whatever its
    probability, about once in 2**24 / vocab draws) and a -inf logit's key NaN (a grammar-masked token
    could win). So it is held at the largest float32 below 1; every other value is unchanged."""
    return torch.clamp(((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24)), max=BELOW_ONE)


def row_key(seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """The 32-bit key of one draw: its seed and output index mixed."""
    return _mix32((seed & _MASK32) ^ _mix32(position * 0x9E3779B1 + 0x7F4A7C15))


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser on int64 tensors holding 32-bit values."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)


def mix_seed(seed: int, index: int) -> int:
    """The seed of parallel sample `index` of a request seeded `seed` (sample 0 keeps it)."""
    if index == 0:
        return seed
    x = (seed ^ (index * 0x9E3779B97F4A7C15)) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 31)) & 0xFFFFFFFF
