"""Preallocated step IO: pinned host arrays and their device twins, in two sets.

Step k uses set k % 2. The host writes set s only after it has waited for step k - 2's D2H event,
which the device signals after step k - 2's H2D, compute and D2H are all done; so the host never
overwrites a buffer the device may still read, and no step allocates IO memory. On the CPU the
"device" arrays are the host arrays themselves and copies are skipped.
"""

from __future__ import annotations

import numpy as np
import torch

# name -> (rows: "tokens" | "seqs", columns: None | "table", dtype)
FIELDS: dict[str, tuple[str, str | None, torch.dtype]] = {
    "input_ids": ("tokens", None, torch.int64),
    "prev_rows": ("tokens", None, torch.int64),
    "positions": ("tokens", None, torch.int64),
    "slot_mapping": ("tokens", None, torch.int64),
    "decode_tables": ("seqs", "table", torch.int64),
    "decode_lens": ("seqs", None, torch.int64),
    "prefill_tables": ("seqs", "table", torch.int64),
    "sample_rows": ("seqs", None, torch.int64),
    "temperature": ("seqs", None, torch.float32),
    "top_k": ("seqs", None, torch.int64),
    "top_p": ("seqs", None, torch.float32),
    "seed": ("seqs", None, torch.int64),
    "out_position": ("seqs", None, torch.int64),
}


class StepBuffers:
    """One set of IO buffers sized for the largest step."""

    def __init__(self, device: torch.device, max_tokens: int, max_seqs: int, table_width: int) -> None:
        self.device = device
        self.on_cuda = device.type == "cuda"
        sizes = {"tokens": max_tokens, "seqs": max_seqs, "table": table_width}
        self.host: dict[str, torch.Tensor] = {}
        self.dev: dict[str, torch.Tensor] = {}
        for name, (rows, cols, dtype) in FIELDS.items():
            shape = (sizes[rows],) if cols is None else (sizes[rows], sizes[cols])
            self.host[name] = torch.zeros(shape, dtype=dtype, pin_memory=self.on_cuda)
            self.dev[name] = (
                torch.zeros(shape, dtype=dtype, device=device) if self.on_cuda else self.host[name]
            )
        self.np: dict[str, np.ndarray] = {name: t.numpy() for name, t in self.host.items()}
        self.samples_dev = torch.zeros(max_seqs, dtype=torch.int64, device=device)
        self.samples_host = torch.zeros(max_seqs, dtype=torch.int64, pin_memory=self.on_cuda)

    def copy_to_device(self, counts: dict[str, int]) -> None:
        """Enqueue the used prefix of each field (on the current stream; non-blocking from pinned memory)."""
        if not self.on_cuda:
            return
        for name, count in counts.items():
            if count:
                self.dev[name][:count].copy_(self.host[name][:count], non_blocking=True)

    def copy_samples_to_host(self, count: int) -> None:
        self.samples_host[:count].copy_(self.samples_dev[:count], non_blocking=self.on_cuda)
