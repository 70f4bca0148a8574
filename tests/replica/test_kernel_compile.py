"""The engine's CUDA kernels compile for the H200 (sm_90) on a machine without a GPU.

`tests/gpu` runs them on the device; this catches a Triton change that no longer compiles (a type
or layout error) in CI, before device time is spent. Triton's bundled ptxas does the last step, so
the check reaches the machine code. The split decode kernel's merge also needs an order: every
warp's partial stores must precede the arrival count (one thread does the scalar atomic).
"""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")  # installed with the test extra on Linux x86-64

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from replica.triton_decode import _paged_decode_kernel  # noqa: E402
from replica.triton_fused import _add_rmsnorm_kernel, _rope_cache_kernel, _silu_mul_kernel  # noqa: E402

H200 = GPUTarget("cuda", 90, 32)


def compile_for_h200(
    fn,
    types: dict[str, str],
    constants: dict[str, object],
    num_warps: int = 4,
    num_stages: int = 3,
    aligned: tuple[str, ...] = (),
):
    """Compile a @triton.jit function: `types` for its runtime arguments, `constants` for the rest.
    `aligned` names arguments that are multiples of 16 at run time (Triton's launcher sees that
    for pointers and strides and compiles vectorised, pipelined loads), so the build is the one
    the GPU runs."""
    signature = {name: types.get(name, "constexpr") for name in fn.arg_names}
    missing = [name for name, kind in signature.items() if kind == "constexpr" and name not in constants]
    assert not missing, f"no value for {missing}"
    constexprs = {(fn.arg_names.index(name),): value for name, value in constants.items()}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=H200, options={"num_warps": num_warps, "num_stages": num_stages})


def decode_types(dtype: str) -> dict[str, str]:
    pointers = {name: f"*{dtype}" for name in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")}
    pointers |= {"tables_ptr": "*i64", "lens_ptr": "*i64", "pos_ptr": "*i64", "slot_ptr": "*i64"}
    pointers |= {"part_acc_ptr": "*fp32", "part_ml_ptr": "*fp32", "rope_ptr": "*fp32", "counter_ptr": "*i32"}
    strides = ("stride_q_tok", "stride_q_head", "stride_k_slot", "stride_k_head", "stride_table")
    return (
        pointers
        | {"scale": "fp32", "stride_k_block": "i64"}
        | dict.fromkeys(("k_scale", "v_scale", "inv_k", "inv_v"), "fp32")  # an FP8 cache's scales
        | dict.fromkeys(strides, "i32")
        | {"stride_o_tok": "i32", "stride_o_head": "i32"}
    )


DECODE_VARIANTS = [
    ("bf16", False, 1),
    ("bf16", True, 1),
    ("bf16", True, 4),
    ("bf16", False, 4),
    ("fp32", False, 3),
]


@pytest.mark.parametrize(("dtype", "rope", "splits"), DECODE_VARIANTS)
def test_decode_attention_compiles_and_orders_its_split_merge(dtype, rope, splits):
    constants = dict(
        GROUP=4, GROUP_PAD=16, HEAD_DIM=128, BLOCK_SIZE=16, TOKENS=128, SPLITS=splits,
        PRECISION="ieee" if dtype == "fp32" else "tf32", ROPE=rope, Q_HEADS=32, KV_HEADS=8, FP8=False,
        WIDEN=triton.language.float16,
    )  # fmt: skip
    ptx = compile_for_h200(_paged_decode_kernel, decode_types(dtype), constants).asm["ptx"]
    lines = ptx.splitlines()
    atomics = [i for i, line in enumerate(lines) if "atom.global" in line]
    if splits == 1:
        assert not atomics
        return
    assert len(atomics) == 1 and "acq_rel" in lines[atomics[0]]
    stores = [i for i, line in enumerate(lines[: atomics[0]]) if "st.global" in line]
    barrier = [i for i, line in enumerate(lines[: atomics[0]]) if "bar.sync" in line]
    assert barrier and barrier[-1] > stores[-1], "the partial stores must pass a barrier before the count"


# (dtype, query heads, KV heads, head_dim): Qwen2.5-7B (a group of 7), Qwen3-0.6B (head_dim 128 over
# hidden 1024), Mistral-7B, and the float32 tiny checkpoints of tests/gpu/test_architectures_gpu.py.
ARCH_SHAPES = [
    ("bf16", 28, 4, 128),
    ("bf16", 16, 8, 128),
    ("bf16", 32, 8, 128),
    ("fp32", 4, 2, 32),
    ("fp32", 4, 2, 64),
]


@pytest.mark.parametrize(("dtype", "heads", "kv_heads", "head_dim"), ARCH_SHAPES)
def test_decode_and_rope_kernels_compile_for_each_architecture_shape(dtype, heads, kv_heads, head_dim):
    group = heads // kv_heads
    for rope, splits in ((True, 1), (False, 3)):
        constants = dict(
            GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_SIZE=16,
            TOKENS=128, SPLITS=splits, PRECISION="ieee" if dtype == "fp32" else "tf32", ROPE=rope,
            Q_HEADS=heads, KV_HEADS=kv_heads, FP8=False, WIDEN=triton.language.float16,
        )  # fmt: skip
        assert (
            "st.global" in compile_for_h200(_paged_decode_kernel, decode_types(dtype), constants).asm["ptx"]
        )
    rope_types = {"qkv_ptr": f"*{dtype}", "pos_ptr": "*i64", "table_ptr": "*fp32", "slot_ptr": "*i64"}
    rope_types |= {"k_cache_ptr": f"*{dtype}", "v_cache_ptr": f"*{dtype}", "stride_tok": "i32"}
    rope_types |= {"inv_k": "fp32", "inv_v": "fp32"}
    shape = dict(Q_HEADS=heads, KV_HEADS=kv_heads, DIM=head_dim, HALF=head_dim // 2, FP8=False)
    assert "st.global" in compile_for_h200(_rope_cache_kernel, rope_types, shape).asm["ptx"]


@pytest.mark.parametrize(("parts", "has_res"), [(0, False), (0, True), (2, True), (7, True)])
def test_add_rmsnorm_compiles_with_and_without_partials(parts, has_res):
    types = {"x_ptr": "*fp32" if parts else "*bf16", "res_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16"}
    types |= {"dim": "i32", "eps": "fp32", "part_stride": "i32"}
    kernel = compile_for_h200(_add_rmsnorm_kernel, types, dict(BLOCK=4096, HAS_RES=has_res, PARTS=parts), 8)
    assert "ld.global" in kernel.asm["ptx"]


def test_rope_cache_and_silu_kernels_compile():
    rope_types = {"qkv_ptr": "*bf16", "pos_ptr": "*i64", "table_ptr": "*fp32", "slot_ptr": "*i64"}
    rope_types |= {
        "k_cache_ptr": "*bf16",
        "v_cache_ptr": "*bf16",
        "stride_tok": "i32",
        "inv_k": "fp32",
        "inv_v": "fp32",
    }
    rope = compile_for_h200(
        _rope_cache_kernel, rope_types, dict(Q_HEADS=32, KV_HEADS=8, DIM=128, HALF=64, FP8=False)
    )
    silu_types = {"gate_up_ptr": "*bf16", "out_ptr": "*bf16", "inter": "i32"}
    silu = compile_for_h200(_silu_mul_kernel, silu_types, dict(BLOCK=1024))
    assert "st.global" in rope.asm["ptx"] and "st.global" in silu.asm["ptx"]


@pytest.mark.parametrize(("dtype", "block_m"), [("bf16", 16), ("bf16", 32), ("bf16", 64), ("fp16", 32)])
def test_partials_gemm_compiles_to_tensor_core_code(dtype, block_m):
    from replica.triton_gemm import BLOCK_K, BLOCK_N, _partials_kernel

    types = {"x_ptr": f"*{dtype}", "w_ptr": f"*{dtype}", "out_ptr": "*fp32"}
    types |= dict.fromkeys(("M", "N", "K_PART", "stride_x", "stride_w"), "i32")
    constants = dict(BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    aligned = ("x_ptr", "w_ptr", "out_ptr", "N", "K_PART", "stride_x", "stride_w")
    kernel = compile_for_h200(
        _partials_kernel, types, constants, num_stages=4, aligned=aligned
    )  # as launched
    ptx = kernel.asm["ptx"]
    assert "wgmma" in ptx  # the dot runs on the H200's warpgroup matrix units, not scalar FMAs
    assert "cp.async" in ptx  # W tiles stream through the asynchronous copy pipeline
    assert kernel.metadata.shared <= 227 * 1024  # and its stages fit one multiprocessor


def test_greedy_kernels_compile():
    from replica.triton_greedy import CHUNK, _chunk_max_kernel, _pick_kernel

    types = {"logits_ptr": "*bf16", "best_ptr": "*fp32", "best_id_ptr": "*i32", "out_ptr": "*i64"}
    types |= {"vocab": "i32", "stride": "i32", "chunks": "i32"}
    chunk = compile_for_h200(_chunk_max_kernel, types, dict(CHUNK=CHUNK))
    pick = compile_for_h200(_pick_kernel, types, dict(CHUNKS=32))
    assert "st.global" in chunk.asm["ptx"] and "st.global" in pick.asm["ptx"]


def test_sampler_kernels_compile_with_32_bit_noise():
    from replica import triton_penalties
    from replica import triton_sampler as ts

    ptrs = {"temp_ptr": "*fp32", "top_k_ptr": "*i64", "top_p_ptr": "*fp32", "min_p_ptr": "*fp32"}
    ptrs |= {
        "seed_ptr": "*i64",
        "pos_ptr": "*i64",
        "logits_ptr": "*fp32",
        "out_ptr": "*i64",
        "top_ptr": "*fp32",
    }
    ptrs |= {"pending_ptr": "*i32", "part_max_ptr": "*fp32", "part_key_ptr": "*fp32", "part_id_ptr": "*i32"}
    ptrs |= {"part_count_ptr": "*i32", "part_mass_ptr": "*fp32", "part_total_ptr": "*fp32"}
    ptrs |= {"total_ptr": "*fp32", "values_ptr": "*fp32", "ids_ptr": "*i64"}
    ints = dict.fromkeys(("stride", "vocab", "span", "splits"), "i32")

    def build(fn, constants, warps=ts.NUM_WARPS):
        return compile_for_h200(fn, ptrs | ints, constants, num_warps=warps)

    ptrs |= {"k_floor_ptr": "*fp32"}
    race = build(ts._race_kernel, dict(BLOCK=ts.BLOCK))
    check = build(ts._check_kernel, dict(BLOCK=ts.BLOCK))
    tail = build(ts._chain_tail, dict(LINKS=62, BLOCK=4096), warps=16)
    for combine in (ts._race_combine, ts._check_combine):
        assert "st.global" in build(combine, dict(SPLITS=16)).asm["ptx"]
    from replica import triton_top_k as tk

    ptrs |= {"k_floor_ptr": "*fp32", "prefix_ptr": "*i64", "hist_ptr": "*i32", "left_ptr": "*i32"}
    ptrs |= {"floor_ptr": "*fp32"}
    combine = compile_for_h200(
        tk._radix_combine, ptrs | ints | {"shift": "i32"}, dict(TILE=tk.SPLIT_TILE, BINS=tk.BINS)
    )
    assert "st.global" in combine.asm["ptx"]
    for shift in (24, 0):
        radix = build(tk._radix_pass, dict(SHIFT=shift, BLOCK=tk.BLOCK, BINS=tk.BINS))
        assert "st.global" in radix.asm["ptx"]
    for kernel in (race, check, tail):
        ptx = kernel.asm["ptx"]
        # The hash stays in 32-bit integers: 64-bit multiplies only for the row's address.
        assert ptx.count("mul.lo.s32") > 10 and ptx.count("mul.lo.s64") <= 2, ptx.count("mul.lo.s64")
    penalty_types = {"raw_ptr": "*bf16", "raw_stride": "i32", "out_ptr": "*fp32", "vocab": "i32"}
    penalty_types |= {"slot_ptr": "*i64", "rep_ptr": "*fp32", "freq_ptr": "*fp32", "pres_ptr": "*fp32"}
    penalty_types |= {"counts_ptr": "*i32", "prompt_ptr": "*u8"}
    penalty = compile_for_h200(triton_penalties._penalty_kernel, penalty_types, dict(BLOCK=4096))
    assert "st.global" in penalty.asm["ptx"]
