"""The sampler's noise never reaches E = 0. A hash whose top 24 bits are all ones made the uniform
round to 1.0 in float32, E = -log(1) = 0 and that token's key infinite: it won the race whatever its
probability (about once in 2**24 / vocab draws), and under a grammar mask a -inf logit's key was NaN,
so a masked token could be drawn. Both the torch reference and the CUDA kernel's noise (run by Triton's
interpreter) stay finite at such a hash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from replica.sampler import _mix32, row_key, uniform_from_bits

SEED, POSITION = 7, 0
TOP_ID = 64_934_294  # found by search: its hash under (SEED, POSITION) has its top 24 bits set


def _bits(token: int) -> torch.Tensor:
    key = row_key(torch.tensor([SEED]), torch.tensor([POSITION]))
    return _mix32(_mix32(key ^ torch.tensor([token]) * 0x85EBCA77) + key)


def test_the_top_hash_keeps_the_uniform_below_one():
    bits = _bits(TOP_ID)
    assert int(bits[0]) >> 8 == (1 << 24) - 1
    uniform = uniform_from_bits(bits)
    assert 0 < float(uniform[0]) < 1
    noise = -torch.log(uniform)
    assert float(noise[0]) > 0
    masked = torch.tensor([float("-inf")]) - torch.log(noise)  # a masked logit's key stays -inf
    assert masked[0] == float("-inf")


CHILD = r"""
import json
import tests.replica.triton_on_cpu  # noqa: F401  (the interpreter patch)
import torch
import triton
import triton.language as tl
from replica.sampler import row_key
from replica.triton_noise import _gumbel

@triton.jit
def _probe(out_ptr, key, token):
    ids = tl.full((1,), token, tl.int64)
    tl.store(out_ptr + tl.arange(0, 1), _gumbel(key.to(tl.uint32), ids))

out = torch.zeros(1)
key = int(row_key(torch.tensor([SEED]), torch.tensor([POSITION]))[0])
_probe[(1,)](out, key, TOP_ID)
print(json.dumps({"gumbel": float(out[0])}))
"""


def test_the_kernel_noise_is_finite_at_the_top_hash():
    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    code = f"SEED, POSITION, TOP_ID = {SEED}, {POSITION}, {TOP_ID}\n" + CHILD
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    gumbel = json.loads(done.stdout.strip().splitlines()[-1])["gumbel"]
    assert gumbel == gumbel and abs(gumbel) != float("inf"), gumbel
