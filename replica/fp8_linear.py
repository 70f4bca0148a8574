"""A linear layer with FP8 (e4m3) weights: one float32 scale per output channel, activations
quantised per token as they arrive (replica/fp8_quant.py states the maths).

The model builds its four projections per layer (qkv, o, gate_up, down) through `make_linear`, which
gives this module inside `quantized_linears("fp8")` and a plain `nn.Linear` otherwise; embeddings,
norms and the LM head stay in the model dtype. On CUDA the product runs on the FP8 tensor cores
(replica/fp8_kernels.py); elsewhere (the CPU tests) as the float32 reference, rounded to x's dtype.
`require_fp8_device` refuses devices without FP8 tensor cores (compute capability below 8.9).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from replica.errors import UnsupportedDeviceError
from replica.fp8_quant import FP8_DTYPE, channel_scales, quantize_weight, reference_linear
from replica.lazy_memory import UninitialisedLinear

QUANTIZATIONS = ("fp8",)
MIN_CAPABILITY = (8, 9)  # Ada and Hopper: the first GPUs with FP8 tensor cores
_QUANTIZATION: ContextVar[str | None] = ContextVar("fairlane_linear_quantization", default=None)


class FP8Linear(nn.Module):
    """y = x @ (q_w · s_w).T + bias, x quantised per token. `weight`: e4m3 [out, in] (a buffer: it is
    never trained); `weight_scale`: float32 [out]; `bias`: the model dtype, as in nn.Linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=FP8_DTYPE))
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        # The GEMM's unit scales, made once on the module's device (never inside a graph capture).
        self.register_buffer("unit_scale", torch.ones((), dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and _tensor_cores_take(x, self.weight):
            from replica.fp8_kernels import fp8_linear

            shape = x.shape
            rows = x.reshape(-1, shape[-1])
            y = fp8_linear(rows, self.weight, self.weight_scale, self.bias, self.unit_scale)
            return y.reshape(*shape[:-1], self.out_features)
        return reference_linear(x, self.weight, self.weight_scale, self.bias).to(x.dtype)

    @torch.no_grad()
    def quantize_rows_from(self, weight: torch.Tensor, rows: slice = slice(None)) -> None:
        """Quantise a full-precision W (or the rows of a fused W that one checkpoint tensor fills)
        per output channel, on this module's device."""
        q, scales = quantize_weight(weight.to(self.weight.device, torch.float32))
        self.weight[rows].copy_(q)
        self.weight_scale[rows].copy_(scales)

    @torch.no_grad()
    def set_rows(self, weight_q: torch.Tensor, scale: torch.Tensor, rows: slice = slice(None)) -> None:
        """Take an e4m3 W as a checkpoint stores it, with its scale (per tensor or per channel)."""
        target = self.weight[rows]
        self.weight[rows].copy_(weight_q.to(target.device))
        self.weight_scale[rows].copy_(channel_scales(scale, target.shape[0]).to(target.device))

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        )


def _tensor_cores_take(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """`torch._scaled_mm` takes K and N in multiples of 16, and x in bf16 or fp16."""
    k, n = weight.shape[1], weight.shape[0]
    return x.dtype in (torch.bfloat16, torch.float16) and k % 16 == 0 and n % 16 == 0 and x.stride(-1) == 1


def make_linear(in_features: int, out_features: int, bias: bool) -> nn.Module:
    """The model's projection layers: FP8 inside `quantized_linears("fp8")`, else nn.Linear."""
    if _QUANTIZATION.get() == "fp8":
        return FP8Linear(in_features, out_features, bias=bias)
    return UninitialisedLinear(in_features, out_features, bias=bias)  # the loader writes it


@contextmanager
def quantized_linears(quantization: str | None) -> Iterator[None]:
    """Build a model's projections quantised (None: in the model dtype) while the block runs."""
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}")
    token = _QUANTIZATION.set(quantization)
    try:
        yield
    finally:
        _QUANTIZATION.reset(token)


def fp8_modules(model: nn.Module) -> dict[str, FP8Linear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, FP8Linear)}


def require_fp8_device(device: torch.device, what: str = "quantization 'fp8'") -> None:
    """UnsupportedDeviceError unless `device` is a GPU with FP8 tensor cores (capability >= 8.9)."""
    need = f"{what} needs a CUDA GPU of compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}"
    if device.type != "cuda":
        raise UnsupportedDeviceError(f"{need} (Ada, Hopper or newer); this engine runs on the {device.type}")
    capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise UnsupportedDeviceError(
            f"{need}; {device} is {name}, compute capability {capability[0]}.{capability[1]}"
        )


@torch.no_grad()
def init_random_fp8(model: nn.Module, std: float, generator: torch.Generator) -> None:
    """Random N(0, std) weights for every FP8 projection, quantised per channel a slice at a time
    (a 70B layer's gate/up never exists in full precision). Biases are parameters: set with the rest."""
    for module in fp8_modules(model).values():
        step = max(1, (1 << 26) // module.in_features)  # about 256 MB of float32 per slice
        for start in range(0, module.out_features, step):
            rows = slice(start, min(start + step, module.out_features))
            shape = (rows.stop - rows.start, module.in_features)
            values = torch.empty(shape, dtype=torch.float32, device=module.weight.device)
            module.quantize_rows_from(values.normal_(0.0, std, generator=generator), rows)
