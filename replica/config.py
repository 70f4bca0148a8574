"""Engine configuration: a frozen dataclass validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from replica.errors import InvalidRequestError

EngineMode = Literal["auto", "async", "sync"]


@dataclass(frozen=True)
class EngineConfig:
    """Everything that shapes one replica engine.

    model: a preset name (see `replica.presets`) or a local Hugging Face model directory.
    mode: "async" builds step N+1 before reading step N's tokens back; "sync" reads back after every
    step (the baseline the benchmarks compare against); "auto": async on CUDA, sync on the CPU. On
    the CPU a step's forward runs inside its launch, so async overlaps nothing there and only hands
    every step's tokens out one step later (SmolLM2 behind the cluster on a 2-core box: the engine's
    TTFT for a short chat 227 → 126-187 ms, docs/bench/HISTORY.md).
    """

    model: str = "smollm2-135m"
    device: str = "auto"  # "cpu", "cuda", "cuda:1" or "auto" (cuda when available)
    dtype: str = "auto"  # "auto" = float32 on CPU, bfloat16 on CUDA
    # "fp8": the projections' weights in e4m3 with per-channel scales, activations quantised per token
    # (replica/fp8_linear.py, docs/engine.md "FP8"); needs compute capability >= 8.9. None: the
    # checkpoint's own (an FP8 checkpoint's quantization_config turns it on), else the model dtype.
    quantization: str | None = None
    # With FP8: projections left in the model dtype, as Hugging Face module names or "re:" patterns
    # (compressed-tensors' `ignore` syntax; replica/fp8_skip.py), on top of the checkpoint's own list.
    # On SmolLM2-135M the last two layers' ("re:model\.layers\.(28|29)\.") cut the perplexity rise
    # from +5.3% to +2.6% (tests/replica/test_fp8.py).
    fp8_skip_modules: tuple[str, ...] = ()
    # "auto": the model dtype. "fp8": e4m3 with a per-tensor scale per layer for K and V (1.0 unless the
    # checkpoint has k_scale / v_scale), half the bytes per block, so twice the blocks for the same
    # memory (replica/kv_quant.py, docs/engine.md "FP8"); needs compute capability >= 8.9.
    kv_cache_dtype: str = "auto"
    random_weights: bool = False
    mode: EngineMode = "auto"
    block_size: int = 16
    # The engine's sizes; None: chosen for the device (replica/engine_sizes.py states the rule).
    num_kv_blocks: int | None = None  # None: from kv_cache_tokens (CPU) or free memory (CUDA)
    kv_cache_tokens: int = 32768  # CPU cache size when num_kv_blocks is None
    gpu_memory_fraction: float = 0.85  # CUDA: share of the memory left after the weights for KV
    # CUDA: the share of the device this engine may hold (weights, KV, graphs) when replicas share one
    # card (a fractional `replica_num_gpus`); None: the whole device. The KV pool is then
    # gpu_memory_fraction of what is left of that share after the weights, not of all free memory.
    gpu_memory_share: float | None = None
    max_num_seqs: int | None = None  # sequences in one step at most
    max_num_batched_tokens: int | None = None  # tokens in one step at most (prompts are chunked)
    max_model_len: int | None = None  # None: the model's own limit, capped at 8192
    cuda_graphs: bool = True
    # CUDA, bf16/fp16: graphs also for greedy steps that mix decode rows with prompt chunks starting
    # their sequence (padded to a token ladder; see replica/mixed_graphs.py). Needs cuda_graphs.
    mixed_cuda_graphs: bool = True
    # Also graph mixed steps whose chunks continue their sequences (a prompt after a cached prefix,
    # a long prompt's later chunks): a second ladder of gathered keys (replica/mixed_graphs.py).
    # On the H200 (8B shape, 50 tenants' 5-turn chats, caching on) it cut TTFT p50 at 80% load from
    # 47 to 25 ms and raised saturation output from 2,433 to 3,032 tok/s (BENCHMARKS.md, dec02).
    # Needs mixed_cuda_graphs.
    context_cuda_graphs: bool = True
    # Where mixed graphs run: a prompt that fits a step whole is not split behind another prompt's
    # chunk (it starts the next step), so prefill steps stay graphable. On the H200 it cut SmolLM2's
    # TTFT p50 from 38 to 11 ms; on the 8B shape's lockstep benchmark (32 equal prompts) it cost
    # 2-3% decode throughput (docs/bench/HISTORY.md). False: prompts are split to fill every step's budget.
    keep_prompts_whole: bool = True
    fused_kernels: bool = True  # CUDA: Triton kernels for norm+residual, rope+KV write, SiLU×up
    # CUDA: the paged decode kernel's context splits per (sequence, KV head). None: from the batch
    # size (replica/triton_decode.py `default_splits`); 1: each program walks its whole context.
    decode_attention_splits: int | None = None
    decode_attention_tile: int = 128  # CUDA: cache tokens per iteration of that kernel (16 to 256)
    # CUDA, pure decode steps: that kernel also applies the rotary embedding and writes the new
    # keys and values to the cache (one launch fewer per layer). False: a separate kernel does.
    decode_attention_rope: bool = True
    # CUDA bf16/fp16, fused kernels, decode-sized steps: the output and down projections as this
    # many float32 K-slice partial products, added by the next residual-add + RMSNorm kernel,
    # instead of cuBLAS's split-K with its own reduce kernel. 0: cuBLAS decides; 1: cuBLAS decides
    # except for the projections in decode_triton_gemms (one partial, from the Triton kernel).
    # Two measured best on the 8B shape at batch 32 (docs/bench/HISTORY.md).
    decode_k_slices: int = 2
    # CUDA bf16/fp16, fused kernels, decode-sized steps: which of the output ("o") and down ("down")
    # projections a Triton kernel computes as those partials (replica/triton_gemm.py) instead of a
    # batched cuBLAS GEMM. Needs decode_k_slices >= 1. The output projection's measured faster on
    # the 8B shape (decode step 27 µs shorter); the down projection's measured even.
    decode_triton_gemms: tuple[str, ...] = ("o",)
    weights_seed: int = 0
    # Automatic prefix caching (replica/prefix_cache.py): full KV blocks are kept and found again by
    # a hash chain over their tokens, rooted in the model and the request's cache scope (the tenant).
    enable_prefix_caching: bool = True
    profile_history: int = 4096  # steps kept by the step profiler
    # The interpreter's thread switch interval while a CUDA engine runs (None: leave Python's 5 ms).
    # The engine thread gives up the GIL at every device call; when the callers' event loop is busy
    # (hundreds of streams), getting it back takes up to one interval, which then stalls the GPU.
    # On the CPU the engine thread computes itself, and a shorter interval only adds switches.
    gil_switch_interval_ms: float | None = 0.5
    # Async mode: plan each step once the step on the device is about to end, not as it begins, so
    # requests arriving meanwhile join the next step (replica/late_launch.py). Off by default: on the
    # H200 (8B shape) it cut the engine's TTFT p50 at 20 req/s by 12% at no throughput cost, but
    # behind the cluster's router it did not shorten the quiet tenants' TTFT, and one of two A/Bs
    # lost 7% TPOT (docs/bench/HISTORY.md). None: on with CUDA. The margin is the headroom left
    # before the expected end, against wake-up and estimate errors.
    late_launch: bool | None = False
    late_launch_margin_ms: float = 1.0
    # Multi-LoRA (replica/lora_*.py, docs/engine.md "Multi-LoRA"): adapter slots resident on the device
    # (0: LoRA off, no memory and no work), the rank every slot is sized for (lower ranks are
    # zero-padded), and (name, directory) adapters registered at start.
    lora_slots: int = 0
    max_lora_rank: int = 16
    lora_adapters: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "async", "sync"):
            raise InvalidRequestError(f"mode must be 'auto', 'async' or 'sync', got {self.mode!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise InvalidRequestError(f"unknown dtype {self.dtype!r}")
        if self.quantization not in (None, "fp8"):
            raise InvalidRequestError(f"quantization must be None or 'fp8', got {self.quantization!r}")
        if self.kv_cache_dtype not in ("auto", "fp8"):
            raise InvalidRequestError(f"kv_cache_dtype must be 'auto' or 'fp8', got {self.kv_cache_dtype!r}")
        positive = {
            "block_size": self.block_size,
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "profile_history": self.profile_history,
        }
        for name, value in positive.items():
            if value is not None and value <= 0:
                raise InvalidRequestError(f"{name} must be positive, got {value}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise InvalidRequestError("num_kv_blocks must be at least 2 (block 0 is reserved)")
        if not 0.0 < self.gpu_memory_fraction < 1.0:
            raise InvalidRequestError("gpu_memory_fraction must be in (0, 1)")
        if self.gpu_memory_share is not None and not 0.0 < self.gpu_memory_share <= 1.0:
            raise InvalidRequestError("gpu_memory_share must be in (0, 1]")
        if self.gil_switch_interval_ms is not None and not 0.0 < self.gil_switch_interval_ms <= 100.0:
            raise InvalidRequestError("gil_switch_interval_ms must be in (0, 100]")
        if not 0.0 <= self.late_launch_margin_ms <= 100.0:
            raise InvalidRequestError("late_launch_margin_ms must be in [0, 100]")
        if self.decode_attention_splits is not None and not 1 <= self.decode_attention_splits <= 64:
            raise InvalidRequestError("decode_attention_splits must be in [1, 64]")
        if self.decode_attention_tile not in (16, 32, 64, 128, 256):
            raise InvalidRequestError("decode_attention_tile must be a power of two in [16, 256]")
        if self.decode_k_slices < 0 or self.decode_k_slices > 16:
            raise InvalidRequestError("decode_k_slices must be in [0, 16]")
        unknown = set(self.decode_triton_gemms) - {"o", "down"}
        if unknown:
            raise InvalidRequestError(f"decode_triton_gemms takes 'o' and 'down', not {sorted(unknown)}")
        if self.max_model_len is not None and self.max_model_len <= 1:
            raise InvalidRequestError("max_model_len must be greater than 1")
        self._check_lora()

    def _check_lora(self) -> None:
        from replica.errors import AdapterError

        if not 0 <= self.lora_slots <= 1024:
            raise AdapterError(f"lora_slots must be in [0, 1024], got {self.lora_slots}")
        if not 1 <= self.max_lora_rank <= 64:
            raise AdapterError(f"max_lora_rank must be in [1, 64], got {self.max_lora_rank}")
        names = [name for name, _ in self.lora_adapters]
        if self.lora_adapters and self.lora_slots == 0:
            raise AdapterError("lora_adapters need lora_slots > 0 (LoRA is off)")
        if len(set(names)) != len(names) or not all(names):
            raise AdapterError("lora_adapters: names must be non-empty and distinct")
