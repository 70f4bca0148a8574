"""Preallocated step IO: pinned host memory and its device twin, in two sets.

Step k uses set k % 2. The host writes set s only after it has waited for step k - 2's D2H event,
which the device signals after step k - 2's H2D, compute and D2H are all done; so the host never
overwrites a buffer the device may still read, and no step allocates IO memory. On the CPU the
"device" arrays are the host arrays themselves and copies are skipped.

Every field of a set lives in one flat byte buffer (host and device alike), per-token and per-sequence
fields first, then the decode block tables, then the prefill block tables. A step's inputs therefore
reach the device in one copy (two when it has prefill chunks; the token masks of a constrained
step follow in another, once filled): each copy costs a driver call and a
release of the interpreter lock, so thirteen small copies cost more host time than one larger one.
"""

from __future__ import annotations

import numpy as np
import torch

from replica.sampling_params import MAX_LOGPROBS

# name -> (rows: "tokens" | "seqs" | "chunks" | "chunk_bounds" (chunks + 1) | "one" | "bias", columns:
# None | "table" | "mask_words", dtype); the order is the memory order. Everything before the decode
# tables travels in every step's first copy; the bias entries and token masks (after the prefill
# tables) only in steps that have some.
FIELDS: dict[str, tuple[str, str | None, torch.dtype]] = {
    "input_ids": ("tokens", None, torch.int64),
    "prev_rows": ("tokens", None, torch.int64),
    "positions": ("tokens", None, torch.int64),
    "slot_mapping": ("tokens", None, torch.int64),
    # Penalty bookkeeping of prompt chunks (flat indices into the penalty state; see penalty_state.py)
    # and the next prompt token of each position (prompt logprobs).
    "mark_index": ("tokens", None, torch.int64),
    "count_index": ("tokens", None, torch.int64),
    "target_ids": ("tokens", None, torch.int64),
    "decode_lens": ("seqs", None, torch.int64),
    "sample_rows": ("seqs", None, torch.int64),
    "temperature": ("seqs", None, torch.float32),
    "top_k": ("seqs", None, torch.int64),
    "top_p": ("seqs", None, torch.float32),
    "min_p": ("seqs", None, torch.float32),
    "seed": ("seqs", None, torch.int64),
    "out_position": ("seqs", None, torch.int64),
    "penalty_slot": ("seqs", None, torch.int64),  # -1: the row has no penalties
    "repetition_penalty": ("seqs", None, torch.float32),
    "frequency_penalty": ("seqs", None, torch.float32),
    "presence_penalty": ("seqs", None, torch.float32),
    "reset_slots": ("seqs", None, torch.int64),  # penalty rows to clear before the step
    "copy_src": ("seqs", None, torch.int64),  # KV blocks copied after the step (n > 1 forks)
    "copy_dst": ("seqs", None, torch.int64),
    "row_copy_src": ("seqs", None, torch.int64),  # penalty rows copied after the step (forks)
    "row_copy_dst": ("seqs", None, torch.int64),
    "prefill_cu_q": ("chunk_bounds", None, torch.int32),  # flash varlen offsets: chunk i's queries
    "prefill_cu_k": ("chunk_bounds", None, torch.int32),  # start at cu_q[i], its keys at cu_k[i]
    "num_decode": ("one", None, torch.int32),  # the step's decode rows (mixed CUDA graphs read it)
    "num_bias": ("one", None, torch.int32),  # bias entries used this step (graphs mask the rest)
    # Structured output: each sample row's row of `token_mask`, or -1 (unconstrained: left alone).
    "mask_row": ("seqs", None, torch.int32),
    "logprob_k": ("seqs", None, torch.int32),  # top logprobs a sample row asks for; -1: no logprobs
    # Multi-LoRA (replica/lora_step.py): each token row's adapter slot (-1: none), the rows with one
    # sorted by slot, and the tiles of that order the kernels take. No rows with LoRA off.
    "lora_slot": ("lora_tokens", None, torch.int64),
    "lora_order": ("lora_tokens", None, torch.int32),
    "lora_tile_slot": ("lora_tiles", None, torch.int32),
    "lora_tile_start": ("lora_tiles", None, torch.int32),
    "lora_tile_count": ("lora_tiles", None, torch.int32),
    "decode_tables": ("seqs", "table", torch.int64),
    "prefill_tables": ("chunks", "table", torch.int64),
    "bias_index": ("bias", None, torch.int64),  # flat index (sample row * vocab + token id)
    "bias_value": ("bias", None, torch.float32),
    # The constrained rows' packed allowed-token masks (bit i of word j: token 32 j + i), filled by
    # the grammar matchers; only the step's used rows travel (replica/grammar_masks.py).
    "token_mask": ("seqs", "mask_words", torch.int32),
}
_ALIGN = 256  # bytes; keeps every field's start aligned for vectorised device loads


def _layout(sizes: dict[str, int]) -> tuple[dict[str, tuple[int, tuple[int, ...]]], int]:
    """Byte offset and shape of each field, and the total size."""
    offsets: dict[str, tuple[int, tuple[int, ...]]] = {}
    at = 0
    for name, (rows, cols, dtype) in FIELDS.items():
        shape = (sizes[rows],) if cols is None else (sizes[rows], sizes[cols])
        offsets[name] = (at, shape)
        nbytes = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        at += -(-nbytes // _ALIGN) * _ALIGN
    return offsets, at


def _views(flat: torch.Tensor, offsets: dict[str, tuple[int, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
    views = {}
    for name, (at, shape) in offsets.items():
        dtype = FIELDS[name][2]
        count = int(np.prod(shape))
        itemsize = torch.empty((), dtype=dtype).element_size()
        views[name] = flat[at : at + count * itemsize].view(dtype).view(shape)
    return views


class StepBuffers:
    """One set of IO buffers sized for the largest step."""

    def __init__(
        self,
        device: torch.device,
        max_tokens: int,
        max_seqs: int,
        table_width: int,
        bias_entries: int = 1,
        mask_words: int = 1,
        lora_rows: dict[str, int] | None = None,
        max_chunks: int = 0,
    ) -> None:
        self.device = device
        self.on_cuda = device.type == "cuda"
        self.table_width = table_width
        # A step has at most one prompt chunk per sequence, but a mixed CUDA graph reads a fixed
        # `max_chunks` of them (its padded chunks included), however few sequences the engine runs.
        chunks = max(max_seqs, max_chunks)
        rows = {"tokens": max_tokens, "seqs": max_seqs, "chunks": chunks, "chunk_bounds": chunks + 1}
        rows["one"] = 1
        rows |= lora_rows or {"lora_tokens": 0, "lora_tiles": 0}  # replica/lora_step.py buffer_rows
        rows["bias"] = bias_entries
        sizes = {**rows, "table": table_width, "mask_words": mask_words}
        offsets, total = _layout(sizes)
        self._flat_host = torch.zeros(total, dtype=torch.uint8, pin_memory=self.on_cuda)
        self._flat_dev = (
            torch.zeros(total, dtype=torch.uint8, device=device) if self.on_cuda else self._flat_host
        )
        self.host: dict[str, torch.Tensor] = _views(self._flat_host, offsets)
        self.dev: dict[str, torch.Tensor] = _views(self._flat_dev, offsets)
        self._decode_tables_at = offsets["decode_tables"][0]
        self._prefill_tables_at = offsets["prefill_tables"][0]
        self._bias_at = offsets["bias_index"][0], offsets["bias_value"][0]
        self._mask_at, self._mask_row_bytes = offsets["token_mask"][0], mask_words * 4
        self.np: dict[str, np.ndarray] = {name: t.numpy() for name, t in self.host.items()}
        self.out = SampleOutputs(device, max_seqs)

    @property
    def samples_dev(self) -> torch.Tensor:
        return self.out.dev["tokens"]

    @property
    def samples_host(self) -> torch.Tensor:
        return self.out.host["tokens"]

    def copy_to_device(self, decode_rows: int, prefill_rows: int, bias_entries: int = 0) -> None:
        """Enqueue the step's inputs on the current stream (non-blocking from pinned memory).

        One copy takes every per-token and per-sequence field whole (a few hundred KB at most) plus
        the first `decode_rows` rows of the decode tables; a second takes the used prefill tables.
        """
        if not self.on_cuda:
            return
        row_bytes = self.table_width * 8
        end = self._decode_tables_at + decode_rows * row_bytes
        self._flat_dev[:end].copy_(self._flat_host[:end], non_blocking=True)
        if prefill_rows:
            start = self._prefill_tables_at
            span = slice(start, start + prefill_rows * row_bytes)
            self._flat_dev[span].copy_(self._flat_host[span], non_blocking=True)
        for at, size in zip(self._bias_at, (8, 4), strict=True):
            if bias_entries:
                span = slice(at, at + bias_entries * size)
                self._flat_dev[span].copy_(self._flat_host[span], non_blocking=True)

    def copy_masks_to_device(self, mask_rows: int) -> None:
        """Enqueue the first `mask_rows` token-mask rows (a constrained step's second copy, made once
        the grammar matchers have filled them)."""
        if self.on_cuda and mask_rows:
            span = slice(self._mask_at, self._mask_at + mask_rows * self._mask_row_bytes)
            self._flat_dev[span].copy_(self._flat_host[span], non_blocking=True)

    def copy_samples_to_host(self, count: int, logprobs: bool = False) -> None:
        self.out.to_host(count, logprobs)


class SampleOutputs:
    """What a step hands back: the sampled ids and, in steps where some row asked, the chosen token's
    logprob and the top MAX_LOGPROBS ids and logprobs of each row. Device buffers and pinned host
    twins."""

    def __init__(self, device: torch.device, max_seqs: int) -> None:
        self.on_cuda = device.type == "cuda"
        shapes = {
            "tokens": ((max_seqs,), torch.int64),
            "logprob": ((max_seqs,), torch.float32),
            "top_ids": ((max_seqs, MAX_LOGPROBS), torch.int64),
            "top_logprobs": ((max_seqs, MAX_LOGPROBS), torch.float32),
        }
        self.dev = {name: torch.zeros(shape, dtype=dt, device=device) for name, (shape, dt) in shapes.items()}
        self.host = {
            name: torch.zeros(shape, dtype=dt, pin_memory=self.on_cuda)
            for name, (shape, dt) in shapes.items()
        }

    def to_host(self, count: int, logprobs: bool) -> None:
        names = ("tokens", "logprob", "top_ids", "top_logprobs") if logprobs else ("tokens",)
        for name in names:
            self.host[name][:count].copy_(self.dev[name][:count], non_blocking=self.on_cuda)

    def read(self, count: int, logprobs: bool) -> tuple[np.ndarray, ...]:
        """The host copies (call after the step's D2H event): ids, then logprob arrays if asked."""
        tokens = self.host["tokens"].numpy()[:count]
        if not logprobs:
            return (tokens,)
        return tokens, *(self.host[n].numpy()[:count] for n in ("logprob", "top_ids", "top_logprobs"))
