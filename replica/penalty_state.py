"""Per-sequence token counts on the device, for the repetition, frequency and presence penalties.

Two tensors of [max_seqs + 1, vocab]: `counts` (int32, how often each token appeared in the output)
and `prompt` (uint8, whether it appeared in the prompt). A running sequence with penalties owns the
row of its scheduler slot (`Sequence.row`); the last row is a pad that absorbs the writes of rows
without penalties, so every update is a fixed-shape scatter that a CUDA graph can capture.

They stay on the device and are never rebuilt from Python lists:
- a sequence's first chunk (a new prompt, or a recomputation after preemption) clears its row;
- prompt chunks mark their prompt tokens and count their output tokens (a recomputed sequence's);
- every sampled token is counted in the step that draws it;
- a parallel sample forked from a prompt copies the prompt row of its parent.
"""

from __future__ import annotations

import torch


class PenaltyState:
    def __init__(self, max_seqs: int, vocab: int, device: torch.device) -> None:
        self.vocab = vocab
        self.pad_row = max_seqs
        self.counts = torch.zeros((max_seqs + 1, vocab), dtype=torch.int32, device=device)
        self.prompt = torch.zeros((max_seqs + 1, vocab), dtype=torch.uint8, device=device)
        self._flat_counts = self.counts.view(-1)
        self._flat_prompt = self.prompt.view(-1)

    def pad_index(self, count: int) -> int:
        """Flat index of pad entry `count` (distinct entries, so scatters do not contend)."""
        return self.pad_row * self.vocab + count % self.vocab

    def reset(self, slots: torch.Tensor) -> None:
        self.counts.index_fill_(0, slots, 0)
        self.prompt.index_fill_(0, slots, 0)

    def mark(self, mark_index: torch.Tensor, count_index: torch.Tensor) -> None:
        """A step's chunk tokens: prompt tokens set their flag, output tokens add one to their count."""
        self._flat_prompt.scatter_(0, mark_index, 1)
        self._flat_counts.scatter_add_(0, count_index, torch.ones_like(count_index, dtype=torch.int32))

    def count_samples(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """Add each sampled token to its row's counts (rows with slot -1 write the pad row)."""
        rows = torch.arange(slots.shape[0], device=slots.device)
        pad = self.pad_row * self.vocab + rows % self.vocab
        index = torch.where(slots >= 0, slots * self.vocab + tokens, pad)
        self._flat_counts.scatter_add_(0, index, torch.ones_like(index, dtype=torch.int32))

    def copy_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self.prompt.index_copy_(0, dst, self.prompt.index_select(0, src))

    def process(
        self,
        raw: torch.Tensor,
        slots: torch.Tensor,
        repetition: torch.Tensor,
        frequency: torch.Tensor,
        presence: torch.Tensor,
    ) -> torch.Tensor:
        """Float32 logits [S, vocab] with each row's penalties applied (rows with slot -1 as they are)."""
        if raw.is_cuda:
            from replica.triton_penalties import penalized_logits

            return penalized_logits(raw, slots, repetition, frequency, presence, self.counts, self.prompt)
        return apply_penalties(
            raw.float(), slots, repetition, frequency, presence, self.counts, self.prompt.bool()
        )


def apply_penalties(
    logits: torch.Tensor,
    slots: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    counts: torch.Tensor,
    prompt: torch.Tensor,
) -> torch.Tensor:
    """The torch reference: repetition (transformers' rule: divide positive logits, multiply negative
    ones, for tokens seen in the prompt or the output), then frequency and presence (OpenAI's rule:
    subtract frequency x count + presence x [count > 0], output tokens only)."""
    on = slots >= 0
    if not bool(on.any()):
        return logits
    rows = slots.clamp(min=0)
    seen = counts.index_select(0, rows)
    present = (seen > 0) | prompt.index_select(0, rows)
    rep = repetition[:, None]
    penalised = torch.where(present, torch.where(logits > 0, logits / rep, logits * rep), logits)
    penalised = penalised - (frequency[:, None] * seen + presence[:, None] * (seen > 0))
    return torch.where(on[:, None], penalised, logits)
