"""GPU checks (skipped without CUDA) of the Triton K-slice partials GEMM and the greedy pick.

Run on the GPU machine: python -m pytest tests/gpu -q --confcutdir=tests/gpu
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("rows", [1, 7, 32, 64])
@pytest.mark.parametrize("parts", [1, 2, 4])
def test_triton_partials_sum_to_the_product(rows, parts):
    from replica.triton_gemm import linear_partials_triton

    torch.manual_seed(rows * 10 + parts)
    k, n = 2048, 576  # N not a multiple of the 64-row tile: the edge tile is masked
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
    got = linear_partials_triton(x, w, parts)
    assert got.shape == (parts, rows, n) and got.dtype == torch.float32
    assert _rel(got.sum(0), x.float() @ w.float().T) < 1e-4  # float32 sums of the same bf16 operands


def test_partials_reject_what_they_cannot_run():
    from replica.triton_gemm import linear_partials_triton

    w = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError):  # K slices must be whole 128-wide tiles
        linear_partials_triton(torch.randn(4, 256, device="cuda", dtype=torch.bfloat16), w, 4)
    with pytest.raises(ValueError):  # more rows than a decode step's
        linear_partials_triton(torch.randn(65, 256, device="cuda", dtype=torch.bfloat16), w, 1)
    with pytest.raises(ValueError):  # x and W must share K
        linear_partials_triton(torch.randn(4, 128, device="cuda", dtype=torch.bfloat16), w, 1)
    with pytest.raises(ValueError):  # float32 stays with cuBLAS (exactness reference)
        linear_partials_triton(torch.randn(4, 256, device="cuda"), w.float(), 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_greedy_tokens_equal_argmax_and_take_the_lowest_tied_id(dtype):
    from replica.triton_greedy import greedy_tokens

    torch.manual_seed(0)
    logits = torch.randn(34, 128256, device="cuda").to(dtype)
    logits[3, [5000, 90000, 128255]] = 50.0  # a tie across chunks
    logits[4, [7, 7 + 4096]] = 50.0  # the same offset in two chunks
    logits[5, -1] = 60.0  # the last id, in the masked tail chunk
    logits[6] = float("-inf")
    logits[7, [100, 50]] = 60.0  # a tie within one chunk: the lower id, though stored second
    logits[8, [4095, 4096]] = 60.0  # a tie across a chunk boundary
    got = greedy_tokens(logits)
    assert torch.equal(got, logits.float().argmax(dim=-1))
    expected = {3: 5000, 4: 7, 5: 128255, 6: 0, 7: 50, 8: 4095}
    assert {row: got[row].item() for row in expected} == expected
    logits[9, 11] = float("nan")  # never picked: the row's real maximum is
    logits[9, 12] = 70.0
    assert greedy_tokens(logits)[9].item() == 12


def test_sampler_greedy_rows_use_the_same_pick():
    from replica.sampler import greedy_pick

    logits = torch.randn(4, 49152, device="cuda")
    logits[1, 3] = float("nan")
    logits[1, 4] = 80.0
    assert greedy_pick(logits).tolist()[1] == 4
    assert torch.equal(greedy_pick(logits)[[0, 2, 3]], logits[[0, 2, 3]].argmax(dim=-1))
