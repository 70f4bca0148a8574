"""skinny_linear equals F.linear, falls back where it should, and replays in a CUDA graph (needs CUDA).

Run on the GPU machine: python -m pytest tests/gpu/test_skinny_gemm.py -q --confcutdir=tests/gpu
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
triton = pytest.importorskip("triton")

from replica import skinny_gemm as sk  # noqa: E402 - after the skips: it imports triton

ROWS = (1, 7, 16, 32, 33, 64)
SHAPES_8B = {  # (N, K) of llama-3.1-8b's weights
    "qkv_proj": (6144, 4096),
    "o_proj": (4096, 4096),
    "gate_up_proj": (28672, 4096),
    "down_proj": (4096, 14336),
    "lm_head": (128256, 4096),
}
ODD = {"odd_small": (1000, 1000), "odd_wide": (4100, 1030)}  # N, K off every block size
TOL = {torch.bfloat16: 2e-2, torch.float16: 2e-3}

_weights: dict[tuple[int, int, torch.dtype], torch.Tensor] = {}


def _weight(n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """One weight per shape and dtype for the whole module (the 8B lm_head alone is 1 GB)."""
    key = (n, k, dtype)
    if key not in _weights:
        gen = torch.Generator(device="cuda").manual_seed(n * 7 + k)
        _weights[key] = torch.randn((n, k), device="cuda", generator=gen).mul_(0.02).to(dtype)
    return _weights[key]


def _check(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    tol = TOL[x.dtype]
    torch.testing.assert_close(out, F.linear(x, w), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("shape", sorted({**SHAPES_8B, **ODD}))
def test_matches_f_linear(shape: str, rows: int, dtype: torch.dtype) -> None:
    n, k = {**SHAPES_8B, **ODD}[shape]
    w = _weight(n, k, dtype)
    x = torch.randn((rows, k), device="cuda", dtype=dtype)
    assert sk.uses_kernel(x, w)
    out = sk.skinny_linear(x, w)
    assert out.shape == (rows, n) and out.dtype == dtype
    _check(out, x, w)


@pytest.mark.parametrize("shape", [(4096, 14336), (6144, 4096), (1000, 1000), (4100, 1030)])
@pytest.mark.parametrize("rows", [1, 33])
def test_every_candidate(shape: tuple[int, int], rows: int) -> None:
    """Each config the benchmark may pick, split-K ones included; their counters end at zero."""
    n, k = shape
    w = _weight(n, k, torch.bfloat16)
    x = torch.randn((rows, k), device="cuda", dtype=torch.bfloat16)
    ran = 0
    for config in sk.CANDIDATES:
        try:
            out = sk.skinny_linear(x, w, config=config)
        except triton.runtime.errors.OutOfResources:
            continue  # more shared memory than this GPU has: the benchmark skips it too
        _check(out, x, w)
        ran += 1
    assert ran >= len(sk.CANDIDATES) - 2
    torch.cuda.synchronize()
    for (_device, width, _split), (_ws, lock) in sk._SPLIT_BUFFERS.items():
        if width == n:
            assert int(lock.abs().sum()) == 0


def test_strided_and_batched_inputs() -> None:
    w = _weight(1000, 1000, torch.bfloat16)
    wide = torch.randn((12, 1536), device="cuda", dtype=torch.bfloat16)
    _check(sk.skinny_linear(wide[:, :1000], w), wide[:, :1000], w)  # a column slice: row stride 1536
    x3 = torch.randn((2, 5, 1000), device="cuda", dtype=torch.bfloat16)
    out = sk.skinny_linear(x3, w)
    assert out.shape == (2, 5, 1000)
    _check(out, x3, w)
    x1 = torch.randn(1000, device="cuda", dtype=torch.bfloat16)
    assert sk.skinny_linear(x1, w).shape == (1000,)


def test_fallbacks_are_f_linear() -> None:
    w = _weight(1000, 1000, torch.bfloat16)
    cases = {
        "65 rows": (torch.randn((65, 1000), device="cuda", dtype=torch.bfloat16), w),
        "cpu": (torch.randn((4, 64)), torch.randn((32, 64))),
        "float32": (torch.randn((4, 1000), device="cuda"), w.float()),
        "mixed dtypes": (torch.randn((4, 1000), device="cuda", dtype=torch.float16), w),
        "transposed weight": (torch.randn((4, 1000), device="cuda", dtype=torch.bfloat16), w.t()),
        "no rows": (torch.randn((0, 1000), device="cuda", dtype=torch.bfloat16), w),
    }
    for name, (x, weight) in cases.items():
        if name == "mixed dtypes":
            assert not sk.uses_kernel(x, weight)
            continue  # F.linear itself refuses mixed dtypes
        assert not sk.uses_kernel(x, weight), name
        assert torch.equal(sk.skinny_linear(x, weight), F.linear(x, weight)), name


@pytest.mark.parametrize("split", [1, 4])
def test_graph_replay_with_new_inputs(split: int) -> None:
    n, k, rows = 4096, 4096, 32
    config = sk.SkinnyConfig(64, 128, split, 4, 4)
    w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn((rows, k), device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sk.skinny_linear(x, w, config=config)  # compile and allocate split-K buffers before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sk.skinny_linear(x, w, config=config)
    for seed in range(3):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        x.copy_(torch.randn(x.shape, device="cuda", generator=gen))
        w.copy_(torch.randn(w.shape, device="cuda", generator=gen) * 0.02)
        graph.replay()
        torch.cuda.synchronize()
        _check(out, x, w)


def test_warm_up_tunes_then_captures() -> None:
    n, k = 2048, 2048
    picked = sk.warm_up([(8, n, k), (24, n, k)], torch.float16, "cuda", tune=True, rotate_bytes=1 << 27)
    assert set(picked) == {(8, n, k), (24, n, k)}
    assert all(isinstance(c, sk.SkinnyConfig) for c in picked.values())
    assert sk.chosen_config(3, n, k, torch.float16, torch.device("cuda")) == picked[(8, n, k)]  # same bucket
    w = torch.randn((n, k), device="cuda", dtype=torch.float16) * 0.02
    x = torch.randn((24, k), device="cuda", dtype=torch.float16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sk.skinny_linear(x, w)
    x.normal_()
    graph.replay()
    torch.cuda.synchronize()
    _check(out, x, w)


def test_split_k_first_seen_in_capture_runs_unsplit() -> None:
    """A split-K config whose buffers were never allocated must not allocate inside a capture."""
    n, k, rows = 3008, 2048, 16  # an N no other test uses: no split-K buffers exist for it yet
    w = torch.randn((n, k), device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn((rows, k), device="cuda", dtype=torch.bfloat16)
    sk.skinny_linear(x, w, config=sk.SkinnyConfig(64, 128, 1, 4, 4))  # compile the unsplit variant
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sk.skinny_linear(x, w, config=sk.SkinnyConfig(64, 128, 2, 4, 4))
    assert not any(width == n for (_device, width, _split) in sk._SPLIT_BUFFERS)
    x.normal_()
    graph.replay()
    torch.cuda.synchronize()
    _check(out, x, w)
