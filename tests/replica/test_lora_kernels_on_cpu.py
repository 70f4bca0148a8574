"""The LoRA kernels, run by Triton's interpreter on the CPU, equal the torch reference (a mixed step:
rows of several adapters, of ranks below the pool's, and rows without one, in a shuffled order), and
compile for the H200 (sm_90). tests/gpu runs them on the device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

CHILD = r"""
import tests.replica.triton_on_cpu  # noqa: F401  (the interpreter patch)
from types import SimpleNamespace
import numpy as np
import torch
from replica.lora_ops import lora_reference
from replica.lora_step import fill_lora, max_tiles
from functools import partial
from replica.lora_triton import lora_shrink_expand

g = torch.Generator().manual_seed(3)
slots_n, rank, k = 5, 8, 96
bounds = (0, 64, 96, 128)  # three parts, as q/k/v
a = torch.randn(slots_n, 3 * rank, k, generator=g) / k**0.5
b = torch.randn(slots_n, bounds[-1], rank, generator=g) / rank**0.5
a[:, :, :][2, rank // 2 : rank] = 0  # a lower-rank adapter: zero padding
rows = [3, -1, 0, 3, 2, -1, 4, 0, 3] + [1] * 20 + [-1] * 3 + [2] * 5
tokens = len(rows)
items = [SimpleNamespace(seq=SimpleNamespace(lora_slot=s), num_new=1) for s in rows]
plan = SimpleNamespace(items=items, num_tokens=tokens)
tiles_n = max_tiles(tokens, slots_n)
arrays = {"lora_slot": np.zeros(tokens, np.int64), "lora_order": np.zeros(tokens, np.int32)}
arrays |= {f"lora_tile_{n}": np.zeros(tiles_n, np.int32) for n in ("slot", "start", "count")}
fill_lora(plan, arrays, tokens)
x = torch.randn(tokens, k, generator=g)
base = torch.randn(tokens, bounds[-1], generator=g)
ref = base.clone()
lora_reference(ref, x, a, b, bounds, torch.from_numpy(arrays["lora_slot"]))
tiles = tuple(torch.from_numpy(arrays[f"lora_tile_{n}"]) for n in ("slot", "start", "count"))
none = torch.tensor(rows) < 0
wide = partial(lora_shrink_expand, block_k=32, chunk=32)  # several K-slices, one step each
for kernel in (lora_shrink_expand, wide):
    out = base.clone()
    kernel(out, x, a, b, bounds, torch.from_numpy(arrays["lora_order"]), tiles, tiles_n)
    assert torch.equal(out[none], base[none]), "rows without an adapter were touched"
    err = (out - ref).abs().max().item()
    assert err < 1e-4, err
print("ok", err)
"""


def test_kernels_equal_the_reference_in_the_interpreter():
    root = Path(__file__).resolve().parents[2]
    env = os.environ | {"TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    result = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, cwd=root, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]


def test_kernels_compile_for_h200():
    from replica.lora_triton import _expand_kernel, _shrink_kernel
    from tests.replica.test_kernel_compile import compile_for_h200

    ints = dict.fromkeys(("stride_x", "stride_a_slot", "stride_a_row", "num_tiles", "stride_part_split",
                          "stride_part_row", "K", "NR", "K_CHUNK"), "i32")  # fmt: skip
    pointers = {"x_ptr": "*bf16", "a_ptr": "*bf16", "order_ptr": "*i32", "part_ptr": "*fp32"}
    pointers |= {f"tile_{n}_ptr": "*i32" for n in ("slot", "start", "count")}
    compile_for_h200(
        _shrink_kernel,
        pointers | ints,
        dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, PRECISION="tf32"),
        aligned=("x_ptr", "a_ptr", "stride_x", "stride_a_slot", "stride_a_row"),
    )
    names = ("stride_part_split", "stride_part_row", "stride_b_slot", "stride_b_row", "stride_out")
    ints = dict.fromkeys((*names, "num_tiles", "bound1", "bound2", "N_OUT", "RANK"), "i32")
    pointers = {"part_ptr": "*fp32", "b_ptr": "*bf16", "out_ptr": "*bf16", "order_ptr": "*i32"}
    pointers |= {f"tile_{n}_ptr": "*i32" for n in ("slot", "start", "count")}
    compile_for_h200(
        _expand_kernel,
        pointers | ints,
        dict(SPLITS=8, BLOCK_M=16, BLOCK_N=128, BLOCK_R=16, PRECISION="tf32"),
        aligned=("b_ptr", "out_ptr", "stride_out"),
    )
