"""The CUDA sampler's kernels, run by Triton's interpreter on the CPU, equal the torch reference:
the chained race on random rows with every filter, and the penalties. (tests/gpu runs them on the
device; this catches a logic change in CI.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CHILD = r"""
import json
import tests.replica.triton_on_cpu  # noqa: F401  (the interpreter patch)
import torch
from replica import triton_penalties, triton_sampler, triton_top_k
from replica.penalty_state import apply_penalties
from replica.sampler import SamplingTensors, sample_reference

triton_sampler.BLOCK = 64  # several loop iterations per row
triton_top_k.SPLIT_TILE = 2  # several tiles of split histograms per top-k round
g = torch.Generator().manual_seed(9)
rows, vocab = 40, 300
logits = torch.randn(rows, vocab, generator=g) * torch.rand(rows, 1, generator=g) * 5
logits[3, 17] = float("nan")
params = SamplingTensors(
    temperature=torch.where(torch.rand(rows, generator=g) < 0.2, 0.0, torch.rand(rows, generator=g) + 0.1),
    top_k=torch.randint(0, 30, (rows,), generator=g) * (torch.rand(rows, generator=g) < 0.5),
    top_p=torch.where(torch.rand(rows, generator=g) < 0.5, torch.rand(rows, generator=g) * 0.9 + 0.05, 1.0),
    min_p=torch.where(torch.rand(rows, generator=g) < 0.3, torch.rand(rows, generator=g) * 0.3, 0.0),
    seed=torch.randint(0, 2**32, (rows,), generator=g),
    position=torch.randint(0, 5000, (rows,), generator=g),
)
kernel = triton_sampler.sample_rows(logits, params)
reference = sample_reference(logits, params)
raw = (torch.randn(5, vocab, generator=g) * 3).to(torch.bfloat16)
counts = torch.randint(0, 3, (4, vocab), generator=g, dtype=torch.int32)
counts *= torch.rand(4, vocab, generator=g) < 0.1
prompt = (torch.rand(4, vocab, generator=g) < 0.1).to(torch.uint8)
slots = torch.tensor([0, -1, 2, 1, 3])
pen = [torch.tensor(v) for v in ([1.3, 1.0, 0.8, 1.0, 1.1], [0.5, 0, 0, -0.3, 0.2], [0.1, 0, 1.0, 0, 0.2])]
got = triton_penalties.penalized_logits(raw, slots, *pen, counts, prompt)
ref = apply_penalties(raw.float(), slots, *pen, counts, prompt.bool())
same = bool(torch.equal(got, ref))
print(json.dumps({"kernel": kernel.tolist(), "reference": reference.tolist(), "penalties_equal": same}))
"""


def test_sampler_kernels_equal_the_torch_reference():
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["kernel"] == result["reference"]
    assert result["penalties_equal"]
