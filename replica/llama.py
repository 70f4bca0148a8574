"""A Llama-family decoder that reads and writes the paged KV cache.

Parameter names follow Hugging Face's LlamaForCausalLM except two fusions (q/k/v into `qkv_proj`,
gate/up into `gate_up_proj`) that halve the matrix launches per layer; `weights.py` maps the names.
The maths mirrors transformers' implementation op for op so greedy outputs match `generate`.
Llama, Mistral, Qwen2 and Qwen3 checkpoints share this module: their differences (biases, per-head
q/k norms, head size) come from the config's `ArchSpec` (replica/architectures.py).
"""

from __future__ import annotations

import torch
from torch import nn

from replica.architectures import ArchSpec, arch_spec
from replica.attention import (
    fused_rope_decode,
    fuses_rope_into_decode,
    paged_attention,
    write_kv,
)
from replica.attention_metadata import AttentionMetadata
from replica.fp8_linear import FP8Linear, make_linear
from replica.kv_quant import UNIT_SCALES, KVScales
from replica.lazy_memory import UninitialisedEmbedding, UninitialisedLinear
from replica.rope import RotaryEmbedding
from replica.sampler import greedy_pick

PARTIALS_MAX_ROWS = 64  # K-slice partials pay off where cuBLAS splits K: decode-sized batches


def project(linear: nn.Linear, x: torch.Tensor, k_slices: int, triton: bool = False) -> torch.Tensor:
    """linear(x), or with k_slices > 1 (and a decode-sized x) its float32 K-slice partial products,
    which the next `add_rmsnorm` adds (see replica/triton_fused.py `linear_partials`). With `triton`,
    a Triton kernel computes the partials (replica/triton_gemm.py) where it takes the launch.
    An FP8 projection (replica/fp8_linear.py) always runs its own FP8 product: no partials."""
    # The norm kernel that adds partials adds no bias: a biased projection runs the plain GEMM.
    if isinstance(linear, FP8Linear) or linear.bias is not None:
        return linear(x)
    if triton:
        import replica.triton_gemm as triton_gemm

        if triton_gemm.supports(x, linear.weight, k_slices):  # decode-sized, whole K tiles
            return triton_gemm.linear_partials_triton(x, linear.weight, k_slices)
    if k_slices > 1 and x.shape[0] <= PARTIALS_MAX_ROWS and x.shape[1] % k_slices == 0:
        from replica.triton_fused import linear_partials

        return linear_partials(x, linear.weight, k_slices)
    return linear(x)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, spec: ArchSpec, eps: float) -> None:
        super().__init__()
        head_dim = spec.head_dim
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_size, self.kv_size = heads * head_dim, kv_heads * head_dim
        self.qkv_proj = make_linear(hidden, self.q_size + 2 * self.kv_size, bias=spec.qkv_bias)
        self.o_proj = make_linear(self.q_size, hidden, bias=spec.o_bias)
        self.scale = head_dim**-0.5
        # An FP8 KV cache's per-tensor scales for this layer (replica/kv_quant.py): 1.0 unless the
        # checkpoint has them (replica/fp8_checkpoint.py). Unused when the cache is in the model dtype.
        self.kv_scales: KVScales = UNIT_SCALES
        self.qk_norm = spec.qk_norm  # Qwen3: RMSNorm over each q and k head, before the rotary embedding
        if spec.qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)

    def _norm_heads_in_place(self, qkv: torch.Tensor) -> None:
        """The q and k heads of qkv rows normalised where they are, so the fused rope kernels (which
        read q and k from those rows) see them as transformers' q_norm / k_norm leave them."""
        q = qkv[:, : self.q_size].view(-1, self.heads, self.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].view(-1, self.kv_heads, self.head_dim)
        q.copy_(self.q_norm(q))
        k.copy_(self.k_norm(k))

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.heads, self.head_dim)
        k = k.view(-1, self.kv_heads, self.head_dim)
        v = v.view(-1, self.kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = RotaryEmbedding.apply(q, k, *cos_sin)
        write_kv(kv_cache[0], kv_cache[1], meta.slot_mapping, k, v, self.kv_scales)
        out = paged_attention(q, k, v, kv_cache, meta, self.scale, self.kv_scales)
        return self.o_proj(out.reshape(-1, self.q_size))

    def forward_fused(
        self, x, positions, rope_table, kv_cache, meta: AttentionMetadata, k_slices: int = 0, triton_o=False
    ) -> torch.Tensor:
        """CUDA: one kernel rotates q and k in place and writes k and v to the cache; in a pure decode
        step the attention kernel does that itself (see replica/triton_decode.py)."""
        from replica.triton_fused import rope_and_cache

        qkv = self.qkv_proj(x)
        if self.qk_norm:
            self._norm_heads_in_place(qkv)
        if fuses_rope_into_decode(meta, qkv.shape[0]):
            out = fused_rope_decode(
                qkv, positions, rope_table, kv_cache, meta, self.heads, self.scale, self.kv_scales
            )
            return project(self.o_proj, out.reshape(-1, self.q_size), k_slices, triton_o)
        rope_and_cache(
            qkv, positions, rope_table, meta.slot_mapping, kv_cache, self.heads, self.kv_heads, self.head_dim,
            self.kv_scales,
        )  # fmt: skip
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.heads, self.head_dim)
        k = k.view(-1, self.kv_heads, self.head_dim)
        v = v.view(-1, self.kv_heads, self.head_dim)
        out = paged_attention(q, k, v, kv_cache, meta, self.scale, self.kv_scales)
        return project(self.o_proj, out.reshape(-1, self.q_size), k_slices, triton_o)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, bias: bool = False) -> None:
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = make_linear(hidden, 2 * intermediate, bias=bias)
        self.down_proj = make_linear(intermediate, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)

    def forward_fused(self, x: torch.Tensor, k_slices: int = 0, triton_down: bool = False) -> torch.Tensor:
        from replica.triton_fused import silu_mul

        return project(self.down_proj, silu_mul(self.gate_up_proj(x)), k_slices, triton_down)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, spec: ArchSpec) -> None:
        super().__init__()
        self.self_attn = Attention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, spec, cfg.rms_norm_eps
        )
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, spec.mlp_bias)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos_sin, kv_cache, meta) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    """forward(input_ids, positions, kv_caches, meta) -> hidden states; logits only for sampled rows."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.config = cfg
        self.spec = arch_spec(cfg)
        self.head_dim = self.spec.head_dim
        # Built without their default init: the checkpoint or init_random writes every parameter.
        self.embed_tokens = UninitialisedEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, self.spec) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = UninitialisedLinear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = RotaryEmbedding(cfg, self.head_dim)
        self.fused = False  # the model runner turns on the fused Triton path on CUDA
        self.k_slices = 0  # fused path: o/down projections as K-slice partials (see `project`)
        self.triton_gemms: frozenset[str] = frozenset()  # fused path: of {"o", "down"}, Triton partials

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        if self.fused:
            return self._forward_fused(input_ids, positions, kv_caches, meta)
        x = self.embed_tokens(input_ids)
        cos_sin = self.rotary.cos_sin(positions, x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, cos_sin, kv_cache, meta)
        return self.norm(x)

    def _forward_fused(self, input_ids, positions, kv_caches, meta: AttentionMetadata) -> torch.Tensor:
        """The same maths as `forward` with the residual stream kept apart and norms fused with adds."""
        from replica.triton_fused import add_rmsnorm

        residual = self.embed_tokens(input_ids)
        table = self.rotary.table(positions.device)
        eps = self.config.rms_norm_eps
        hidden = add_rmsnorm(residual, None, self.layers[0].input_layernorm.weight, eps)
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            attn = layer.self_attn.forward_fused(
                hidden, positions, table, kv_cache, meta, self.k_slices, "o" in self.triton_gemms
            )
            hidden = add_rmsnorm(attn, residual, layer.post_attention_layernorm.weight, eps)
            after = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.norm
            mlp = layer.mlp.forward_fused(hidden, self.k_slices, "down" in self.triton_gemms)
            hidden = add_rmsnorm(mlp, residual, after.weight, eps)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor:
        """argmax of the logits in their own dtype: no float32 copy (the cast is exact: same tokens)."""
        return greedy_pick(self.lm_head(hidden))
