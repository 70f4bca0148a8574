"""Structured output inside a step: the host fills each constrained row's token mask, the device
applies it to the logits before the draw.

Host side. A constrained sample row gets the next row of the step's `token_mask` buffer (in its
IO set, packed int32 words) and `mask_row` points at it (`assign_mask_rows`); every other row says
-1. The matcher of a sequence must have accepted every token drawn before the one being drawn: in
async mode the token of step N reaches the host while step N+1 is being prepared. So a step with
constrained rows is launched in two parts (replica/model_runner.py): its forward first, then,
while the device runs it, the engine waits for step N, feeds its tokens to the matchers and fills
the masks (`fill_masks`, replica/engine_core.py); the used mask rows travel in a second copy and
the step's draw follows. The host's mask work hides behind the forward instead of leaving the
device idle. A step with no constrained row does nothing here.

Device side (`apply_token_masks`): logits of disallowed ids become -inf, after penalties, bias and
bans and before temperature, the filters and the draw, so greedy and sampled rows obey it alike. On
CUDA a Triton kernel (graph-safe: unconstrained rows are idle programs); on the CPU torch ops.
"""

from __future__ import annotations

import numpy as np
import torch

from replica.grammar_compiler import accept, terminated
from replica.sequence import Sequence


def constrained_rows(seqs: list[Sequence]) -> list[int]:
    """Sample rows whose sequence has a live matcher."""
    return [i for i, q in enumerate(seqs) if q.matcher is not None and not q.grammar_done]


def assign_mask_rows(rows: list[int], arrays: dict[str, np.ndarray]) -> int:
    """Point constrained sample row rows[k] at mask row k (before the step's first copy); returns
    the mask rows the step uses. The rows themselves are filled later, by `fill_masks`."""
    for k, r in enumerate(rows):
        arrays["mask_row"][r] = k
    return len(rows)


def fill_masks(seqs: list[Sequence], rows: list[int], mask: np.ndarray, grammars) -> None:
    """Fill mask row k with the allowed tokens of rows[k]'s matcher. `mask` is the IO set's host
    `token_mask` array, `grammars` the engine's GrammarCompiler. A row whose grammar ended after the
    step was planned draws a token that is discarded: its mask allows everything."""
    live = []
    for k, r in enumerate(rows):
        if seqs[r].grammar_done:
            mask[k] = -1
        else:
            live.append((seqs[r].matcher, k))
    if live:
        grammars.fill(live, mask)


def apply_token_masks(logits: torch.Tensor, mask_rows: torch.Tensor, masks: torch.Tensor) -> None:
    """Set the logits of disallowed ids to -inf in place; rows with mask_rows -1 are left alone."""
    if logits.is_cuda:
        from replica.triton_token_mask import mask_logits

        mask_logits(logits, mask_rows, masks)
        return
    rows = torch.nonzero(mask_rows >= 0)[:, 0]
    if rows.numel() == 0:
        return
    allowed = unpack(masks[mask_rows[rows].long()], logits.shape[1])
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))


def unpack(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, words] int32 → [rows, vocab] bool (bit i of word j is id 32 j + i)."""
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    bits = (words.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab].bool()


def needs_previous(seqs: list[Sequence], rows: list[int]) -> bool:
    """Some constrained row's previous token is still in flight (counted pending beside this draw)."""
    return any(seqs[r].num_pending > 1 for r in rows)


def advance_matchers(seqs: list[Sequence], tokens: np.ndarray, eos_ids: frozenset[int]) -> None:
    """Feed a step's drawn tokens to its constrained sequences' matchers, as soon as they arrive."""
    for seq, token in zip(seqs, tokens.tolist(), strict=True):
        if seq.matcher is None or seq.grammar_done or seq.finished or seq.params.max_tokens == 0:
            continue
        if not accept(seq.matcher, token):
            seq.grammar_done = True
            seq.grammar_error = f"the response format's grammar refused token {token}"
        elif terminated(seq.matcher, token, eos_ids):
            seq.grammar_done = True
