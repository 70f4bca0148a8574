"""What a step's attention needs to know: where new keys go, what each query attends to, and how
the CUDA decode kernel divides its work. Shared by the torch reference (`attention.py`) and the
CUDA paths (`varlen_prefill.py`, `triton_decode.py`), so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PrefillChunk:
    """One sequence's chunk of new tokens in a step: rows [q_start, q_start + q_len) of the batch."""

    q_start: int
    q_len: int
    context_len: int  # tokens in the cache after this chunk (earlier ones + the chunk)
    block_table: torch.Tensor  # [num_blocks_of_seq] int64, on the device


@dataclass(frozen=True)
class DecodeKernelShape:
    """How the Triton decode kernel (replica/triton_decode.py) divides its work."""

    splits: int | None = None  # context splits per (sequence, KV head); None: from the batch size
    tile: int = 128  # cache tokens per loop iteration
    rope: bool = True  # pure decode: rotary embedding and the cache write inside the kernel

    def launch_args(self) -> dict:
        """The keyword arguments of `paged_decode_attention` that this shape sets."""
        return {"splits": self.splits, "tokens_per_iter": self.tile}


@dataclass
class AttentionMetadata:
    """Where each new token's keys go and what each query may attend to."""

    slot_mapping: torch.Tensor  # [num_tokens] flat cache slot of each new token
    num_decode: int  # the first num_decode rows are single-token decodes
    decode_block_tables: torch.Tensor  # [num_decode, max_blocks] (padded with block 0)
    decode_context_lens: torch.Tensor  # [num_decode]
    prefills: list[PrefillChunk]
    decode_backend: str = "torch"  # "torch" (reference, tables trimmed to the step) or "triton" (CUDA)
    prefill_backend: str = "torch"  # "torch" (reference, one call per chunk), "flash" (CUDA, one call)
    # or "flash_padded" (CUDA graphs of mixed steps: fixed shapes, see mixed_graphs.py)
    # The flash path's packing: query and key offsets of each chunk (int32, on the device) and the
    # longest of each, known on the host so the call needs no sync.
    prefill_cu_q: torch.Tensor | None = None
    prefill_cu_k: torch.Tensor | None = None
    prefill_max_q: int = 0
    prefill_max_k: int = 0
    # "flash_padded" (a mixed CUDA graph, see mixed_graphs.py): the step's decode row count on the device
    decode_rows: torch.Tensor | None = None
    # "flash_padded" with chunks that continue their sequences: the flat cache slot of each packed key
    # (chunk i's whole context at prefill_cu_k[i]; padding reads slot 0 of the reserved block 0)
    prefill_key_slots: torch.Tensor | None = None
    decode_kernel: DecodeKernelShape = DecodeKernelShape()  # CUDA: how the Triton decode kernel divides work
