"""Rotary position embedding with a precomputed cos/sin table (Hugging Face's rotate-half layout)."""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# Rope types with one table for every position. "dynamic" and "longrope" change their frequencies
# with the sequence length in transformers; a fixed table would differ past the original context.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_parameters(cfg) -> dict:
    """The rope settings of a config, in transformers' old and new forms."""
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    if not params:
        params = dict(getattr(cfg, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.pop("type", "default"))
    return params


def inverse_frequencies(cfg, head_dim: int) -> tuple[torch.Tensor, float]:
    params = rope_parameters(cfg)
    if params["rope_type"] == "default":
        dims = torch.arange(0, head_dim, 2, dtype=torch.int64).float()
        return 1.0 / (params["rope_theta"] ** (dims / head_dim)), 1.0
    # Scaled variants (llama3, ...) come from transformers' own table, so they match its models.
    return ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu")


class RotaryEmbedding(nn.Module):
    def __init__(self, cfg, head_dim: int) -> None:
        super().__init__()
        inv_freq, scaling = inverse_frequencies(cfg, head_dim)
        self.max_positions = cfg.max_position_embeddings
        self.scaling = float(scaling)
        self.inv_freq = inv_freq.float()  # a plain attribute: model.to(bfloat16) must not round it
        self._table: torch.Tensor | None = None  # [max_positions, 2, head_dim] float32

    def _build_table(self, device: torch.device) -> torch.Tensor:
        positions = torch.arange(self.max_positions, device=device, dtype=torch.float32)
        freqs = positions[:, None] * self.inv_freq.to(device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return torch.stack((emb.cos() * self.scaling, emb.sin() * self.scaling), dim=1)

    def table(self, device: torch.device) -> torch.Tensor:
        """[max_positions, 2 (cos, sin), head_dim] float32 on `device`, built once."""
        if self._table is None or self._table.device != device:
            self._table = self._build_table(device).contiguous()
        return self._table

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.table(positions.device)[positions]
        return rows[:, 0, None, :].to(dtype), rows[:, 1, None, :].to(dtype)

    @staticmethod
    def apply(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
