"""The token-mask kernel (structured output) compiles for the H200 and, run by Triton's interpreter on
the CPU, sets exactly the torch reference's logits to -inf: constrained rows by their packed masks,
unconstrained rows (-1) untouched. tests/gpu runs it on the device inside the engine's graphs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from replica.triton_token_mask import _token_mask_kernel
from tests.replica.test_kernel_compile import compile_for_h200

CHILD = r"""
import json
import tests.replica.triton_on_cpu  # noqa: F401  (the interpreter patch)
import torch
from replica import triton_token_mask
from replica.grammar_masks import unpack

triton_token_mask.BLOCK = 128  # several blocks per row, the last one partial
g = torch.Generator().manual_seed(3)
rows, vocab = 6, 300
words = -(-vocab // 32)
logits = torch.randn(rows, vocab, generator=g)
masks = torch.randint(-2**31, 2**31 - 1, (8, words), generator=g, dtype=torch.int64).to(torch.int32)
mask_rows = torch.tensor([2, -1, 0, 7, -1, 2], dtype=torch.int32)
got = logits.clone()
triton_token_mask.mask_logits(got, mask_rows, masks)
want = logits.clone()
for r in range(rows):
    if mask_rows[r] >= 0:
        allowed = unpack(masks[mask_rows[r].long()][None], vocab)[0]
        want[r] = want[r].masked_fill(~allowed, float("-inf"))
print(json.dumps({"equal": bool(torch.equal(got, want)), "banned": int(torch.isinf(got).sum())}))
"""


def test_token_mask_kernel_compiles_for_h200():
    types = {"logits_ptr": "*fp32", "mask_ptr": "*i32", "mask_rows_ptr": "*i32"}
    types |= {"vocab": "i32", "logits_stride": "i32", "mask_stride": "i32"}
    ptx = compile_for_h200(_token_mask_kernel, types, {"BLOCK": 4096}).asm["ptx"]
    assert "st.global" in ptx


def test_token_mask_kernel_equals_the_torch_reference():
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["equal"]
    assert result["banned"] > 300  # four constrained rows of random bits: about half of each banned


def test_torch_path_masks_only_constrained_rows():
    import torch

    from replica.grammar_masks import apply_token_masks

    logits = torch.zeros(3, 70)
    masks = torch.zeros(4, 3, dtype=torch.int32)
    masks[1, 0] = 1 << 5  # id 5
    masks[1, 2] = 1 << 1  # id 65
    apply_token_masks(logits, torch.tensor([-1, 1, -1], dtype=torch.int32), masks)
    assert torch.equal(logits[0], torch.zeros(70)) and torch.equal(logits[2], torch.zeros(70))
    assert torch.isfinite(logits[1]).nonzero()[:, 0].tolist() == [5, 65]
