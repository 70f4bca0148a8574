"""The FP8 KV cache's Triton kernels without a GPU: they compile for the H200 (sm_90) with e4m3
caches (saturating e4m3 stores, e4m3 loads), and Triton's interpreter on the CPU runs them against
the torch reference (replica/triton_decode.py, replica/triton_fused.py). tests/gpu runs them on the
device (tests/gpu/test_gpu_fp8_kv.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

from replica.triton_decode import _paged_decode_kernel  # noqa: E402
from replica.triton_fused import _rope_cache_kernel  # noqa: E402
from tests.replica.test_kernel_compile import compile_for_h200, decode_types  # noqa: E402

E4M3_STORE = "cvt.rn.satfinite.e4m3x2"  # round to nearest even, saturating: what torch's cast does
E4M3_TO_F16 = "cvt.rn.f16x2.e4m3x2"  # two e4m3 values widened to float16 in one instruction


@pytest.mark.parametrize(("rope", "splits"), [(False, 1), (True, 1), (True, 4), (False, 3)])
def test_decode_kernel_compiles_over_an_fp8_cache(rope: bool, splits: int) -> None:
    types = decode_types("bf16") | {"k_ptr": "*fp8e4nv", "v_ptr": "*fp8e4nv"}
    constants = dict(
        GROUP=4, GROUP_PAD=16, HEAD_DIM=128, BLOCK_SIZE=16, TOKENS=128, SPLITS=splits, PRECISION="tf32",
        ROPE=rope, Q_HEADS=32, KV_HEADS=8, FP8=True,
    )  # fmt: skip
    ptx = {
        name: compile_for_h200(_paged_decode_kernel, types, constants | {"WIDEN": dtype}).asm["ptx"]
        for name, dtype in (("f16", triton.language.float16), ("bf16", triton.language.bfloat16))
    }
    # Hopper widens e4m3 pairs to float16 in one instruction; bfloat16 then costs a conversion per
    # element more (what the default float16 products save), and the products follow the dtype.
    assert E4M3_TO_F16 in ptx["f16"] and E4M3_TO_F16 in ptx["bf16"]
    assert "cvt.bf16.f16" not in ptx["f16"] and "cvt.bf16.f16" in ptx["bf16"]
    assert "f32.f16.f16.f32" in ptx["f16"] and "f32.bf16.bf16.f32" in ptx["bf16"]
    assert (E4M3_STORE in ptx["f16"]) == rope  # only the rope variant stores keys and values


def test_rope_cache_kernel_compiles_with_saturating_e4m3_stores() -> None:
    types = {"qkv_ptr": "*bf16", "pos_ptr": "*i64", "table_ptr": "*fp32", "slot_ptr": "*i64"}
    types |= {"k_cache_ptr": "*fp8e4nv", "v_cache_ptr": "*fp8e4nv", "stride_tok": "i32"}
    types |= {"inv_k": "fp32", "inv_v": "fp32"}
    shape = dict(Q_HEADS=32, KV_HEADS=8, DIM=128, HALF=64, FP8=True)
    assert E4M3_STORE in compile_for_h200(_rope_cache_kernel, types, shape).asm["ptx"]


CHILD = r"""
import tests.replica.triton_on_cpu  # noqa: F401  (the interpreter patch)
import torch
from replica.attention import decode_attention, write_kv
from replica.kv_quant import KVScales, dequantize_kv, quantize_kv
from replica.rope import RotaryEmbedding
from replica.triton_decode import paged_decode_attention
from replica.triton_fused import rope_and_cache

torch.manual_seed(0)
heads, kv_heads, dim, bs = 4, 2, 32, 16
fp8 = torch.float8_e4m3fn
for scales in (KVScales(), KVScales(0.5, 2.0)):
    # decode over an e4m3 cache, one split and two, against the torch reference over the same cache
    k = quantize_kv(torch.randn(8, bs, kv_heads, dim) * 2, scales.k)
    v = quantize_kv(torch.randn(8, bs, kv_heads, dim), scales.v)
    tables = torch.tensor([[1, 2, 3], [4, 5, 0], [6, 7, 0]])
    lens = torch.tensor([40, 20, 5])
    q = torch.randn(3, heads, dim)
    ref = decode_attention(q, k, v, tables, lens, dim**-0.5, scales)
    for splits in (1, 2):
        out = paged_decode_attention(q, k, v, tables, lens, dim**-0.5, tokens_per_iter=16, splits=splits,
                                     kv_scales=scales)
        err = float((out - ref).abs().max())
        assert err < 1e-5, (scales, splits, err)

    # rope + cache write against write_kv. Triton 3.6's interpreter rounds float32 to e4m3 wrongly
    # where the rounding carries into the exponent and in the subnormals (1.99 -> 1.0, not 2.0); the
    # device's cvt.rn.satfinite does not (tests/gpu compares arbitrary values there). Here every
    # key and value is already an e4m3 value times its scale, at position 0 (cos 1, sin 0), so
    # the stores need no rounding: what is tested is the slots, the scaling and the saturation.
    tokens = 5
    parts = [torch.randn(tokens, heads * dim)]
    for s in (scales.k, scales.v):
        x = dequantize_kv(quantize_kv(torch.randn(tokens, kv_heads * dim) * 8 * s, s), s, torch.float32)
        x[0, :3] = torch.tensor([1000.0, -1000.0, 448.0]) * s  # past the range: saturates at ±448
        parts.append(x)
    qkv = torch.cat(parts, dim=1)
    cfg = type("Cfg", (), {"rope_theta": 10000.0, "max_position_embeddings": 256})()
    table = RotaryEmbedding(cfg, dim).table(torch.device("cpu"))
    positions, slots = torch.zeros(tokens, dtype=torch.long), torch.tensor([16, 20, 35, 70, 90])
    kc, vc = torch.zeros(8, bs, kv_heads, dim, dtype=fp8), torch.zeros(8, bs, kv_heads, dim, dtype=fp8)
    rotated = qkv.clone()
    rope_and_cache(rotated, positions, table, slots, (kc, vc), heads, kv_heads, dim, scales)
    assert torch.equal(rotated, qkv)  # position 0 rotates nothing
    kr, vr = torch.zeros_like(kc), torch.zeros_like(vc)
    write_kv(kr, vr, slots, *(p.view(tokens, kv_heads, dim) for p in parts[1:]), scales)
    assert torch.equal(kc.view(torch.uint8), kr.view(torch.uint8))
    assert torch.equal(vc.view(torch.uint8), vr.view(torch.uint8))
    assert float(kc.view(-1, kv_heads, dim)[16, 0, 0].float()) == 448.0
    assert float(vc.view(-1, kv_heads, dim)[16, 0, 1].float()) == -448.0
print("ok")
"""


def test_fp8_kernels_equal_the_torch_reference_in_the_interpreter() -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
