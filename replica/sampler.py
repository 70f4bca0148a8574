"""Batched sampling on the device: greedy, temperature, top-k, top-p, per-request seeds.

Randomness comes from a counter-based hash of (request seed, output index, vocabulary id), turned
into exponential noise for the Gumbel-max trick: argmax(p / E) draws from p. The draw of a token
depends only on its request's seed and position, never on the batch it ran in, so the same seed
gives the same output under any load, after a preemption too, and the whole thing is a fixed
sequence of tensor ops that a CUDA graph can capture.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF


@dataclass
class SamplingTensors:
    """Per-row parameters of the rows that sample, on the device."""

    temperature: torch.Tensor  # [S] float32, 0 = greedy
    top_k: torch.Tensor  # [S] int64, 0 = off
    top_p: torch.Tensor  # [S] float32, 1 = off
    seed: torch.Tensor  # [S] int64 (32-bit values)
    position: torch.Tensor  # [S] int64: index of the output token being drawn
    all_greedy: bool  # known on the host: skip the random path entirely
    any_top_k: bool
    any_top_p: bool


def sample(logits: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    """One token id per row of logits [S, vocab] (float32)."""
    greedy = greedy_pick(logits)
    if params.all_greedy:
        return greedy
    temperature = params.temperature.clamp(min=1e-5)[:, None]
    probs = torch.softmax(logits / temperature, dim=-1)
    if params.any_top_k or params.any_top_p:
        probs = _filter_top_k_top_p(probs, params)
    noise = exponential_noise(params.seed, params.position, logits.shape[-1])
    drawn = (probs / noise).argmax(dim=-1)
    return torch.where(params.temperature == 0, greedy, drawn)


def greedy_pick(logits: torch.Tensor) -> torch.Tensor:
    """argmax per row; on CUDA the kernel the all-greedy steps use (replica/triton_greedy.py), so a
    greedy row picks alike whatever its batch (the two differ only on NaN, which it never picks)."""
    if logits.is_cuda:
        from replica.triton_greedy import greedy_tokens

        return greedy_tokens(logits)
    return logits.argmax(dim=-1)


def _filter_top_k_top_p(probs: torch.Tensor, params: SamplingTensors) -> torch.Tensor:
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    rank = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if params.any_top_k:
        k = torch.where(params.top_k > 0, params.top_k, probs.shape[-1])[:, None]
        keep &= rank < k
    if params.any_top_p:
        # Keep the smallest prefix whose mass reaches top_p: a token stays if the mass before it is < p.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        keep &= mass_before < params.top_p[:, None]
    keep[:, 0] = True
    filtered = torch.zeros_like(probs)
    return filtered.scatter_(-1, order, sorted_probs * keep)


def exponential_noise(seed: torch.Tensor, position: torch.Tensor, vocab: int) -> torch.Tensor:
    """Exp(1) noise [S, vocab], a pure function of (seed, position, token id)."""
    token = torch.arange(vocab, device=seed.device, dtype=torch.int64)[None, :]
    key = _mix32((seed & _MASK32) ^ _mix32(position * 0x9E3779B1 + 0x7F4A7C15))[:, None]
    bits = _mix32(_mix32(key ^ token * 0x85EBCA77) + key)
    uniform = ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))  # (0, 1), never 0 or 1
    return -torch.log(uniform)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser on int64 tensors holding 32-bit values."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    return x ^ (x >> 16)
