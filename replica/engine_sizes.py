"""How big an engine is: its sequence slots, its step's token budget and its KV pool.

What the config sets is taken as it is. What it leaves unset (None) follows the hardware:

* **KV pool.** CPU: ``kv_cache_tokens``. CUDA: ``gpu_memory_fraction`` of the memory still free once
  the weights are loaded (the rest holds activations, CUDA graphs and the sampler's buffers). With
  ``gpu_memory_share`` (replicas sharing one card), of what is left of that share of the device
  after this process's own allocations: two replicas at 0.3 each leave the rest of the card alone.
  The bytes per block are the cache dtype's (``kv_cache_dtype: fp8`` halves them: twice the blocks).
* **Step budget** (``max_num_batched_tokens``). CPU: 512. CUDA: 2,048, vLLM's budget for an API
  server and the one the 8B shape was measured with on the H200 (``loadtest/configs/gpu-8b.yaml``):
  a prompt chunk that size shares a step with a full decode batch.
* **Slots** (``max_num_seqs``). CPU: 8, the cluster's room there until now; a CPU step computes
  every row itself, so more rows only slow every stream. CUDA: the largest rung of the decode-graph
  ladder (``replica/cuda_graphs.py``) that is at most ``CUDA_MAX_SEQS`` and at most the KV pool over
  ``SLOT_CONTEXT_TOKENS``, so that every slot can hold a long conversation before the pool runs out
  and the scheduler has to preempt. ``CUDA_MAX_SEQS`` is 128: on the H200 the 8B shape served
  13.8k output tok/s there at a TPOT p50 near 8 ms (docs/bench/HISTORY.md); vLLM's larger defaults
  (256 to 1,024 rows) buy throughput with every stream's TPOT, which tenants with a TPOT target pay.

The router's room per replica follows the slots the replica reports (``cluster/routing/``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from replica.config import EngineConfig
from replica.cuda_graphs import DEFAULT_LADDER

CPU_MAX_SEQS = 8
CPU_BATCHED_TOKENS = 512
CUDA_MAX_SEQS = 128
CUDA_BATCHED_TOKENS = 2048
SLOT_CONTEXT_TOKENS = 2048  # KV tokens each slot can count on when every slot is busy


@dataclass(frozen=True)
class EngineSizes:
    """The sizes an engine runs with, and which of them it chose itself."""

    max_num_seqs: int
    max_num_batched_tokens: int
    num_kv_blocks: int
    block_size: int
    chosen: tuple[str, ...] = ()  # the fields the config left unset

    @property
    def kv_tokens(self) -> int:
        return usable_tokens(self.num_kv_blocks, self.block_size)

    def as_dict(self) -> dict:
        return {**asdict(self), "chosen": list(self.chosen), "kv_tokens": self.kv_tokens}


def sizes_for(config: EngineConfig, device: torch.device, kv_bytes_per_block: int) -> EngineSizes:
    """The sizes of an engine of ``config`` on ``device``, once its weights are loaded there."""
    on_cuda = device.type == "cuda"
    return choose_sizes(
        on_cuda=on_cuda,
        block_size=config.block_size,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        num_kv_blocks=config.num_kv_blocks,
        cpu_kv_tokens=config.kv_cache_tokens,
        free_bytes=kv_room_bytes(device, config.gpu_memory_share) if on_cuda else 0,
        memory_fraction=config.gpu_memory_fraction,
        kv_bytes_per_block=kv_bytes_per_block,
    )


def kv_room_bytes(device: torch.device, share: float | None) -> int:
    """The device memory this engine may still take for its KV pool: what is free, and with a
    ``share`` of the device (replicas sharing one card) no more than that share of the whole less
    what this process holds already (its weights), so co-located replicas do not race for it."""
    free, total = torch.cuda.mem_get_info(device)
    return free if share is None else share_room(free, total, torch.cuda.memory_reserved(device), share)


def share_room(free: int, total: int, held: int, share: float) -> int:
    """min(free, share × total − held), never below 0."""
    return max(0, min(free, int(share * total) - held))


def choose_sizes(
    *,
    on_cuda: bool,
    block_size: int,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    num_kv_blocks: int | None,
    cpu_kv_tokens: int,
    free_bytes: int = 0,
    memory_fraction: float = 0.85,
    kv_bytes_per_block: int = 1,
) -> EngineSizes:
    """The sizes by the rule above. ``free_bytes``: the device memory free after the weights (CUDA)."""
    chosen = []
    if num_kv_blocks is None:
        chosen.append("num_kv_blocks")
        if on_cuda:
            num_kv_blocks = max(2, int(free_bytes * memory_fraction) // kv_bytes_per_block)
        else:
            num_kv_blocks = cpu_kv_tokens // block_size + 1
    if max_num_batched_tokens is None:
        chosen.append("max_num_batched_tokens")
        max_num_batched_tokens = CUDA_BATCHED_TOKENS if on_cuda else CPU_BATCHED_TOKENS
    if max_num_seqs is None:
        chosen.append("max_num_seqs")
        max_num_seqs = cuda_slots(usable_tokens(num_kv_blocks, block_size)) if on_cuda else CPU_MAX_SEQS
    return EngineSizes(max_num_seqs, max_num_batched_tokens, num_kv_blocks, block_size, tuple(chosen))


def usable_tokens(num_kv_blocks: int, block_size: int) -> int:
    return (num_kv_blocks - 1) * block_size  # block 0 is reserved


def cuda_slots(kv_tokens: int) -> int:
    """The largest ladder rung ≤ CUDA_MAX_SEQS whose slots each have SLOT_CONTEXT_TOKENS of KV."""
    bound = min(CUDA_MAX_SEQS, kv_tokens // SLOT_CONTEXT_TOKENS)
    return max([1, *(rung for rung in DEFAULT_LADDER if rung <= bound)])
