"""Structured output inside a step: the host fills each constrained row's token mask, the device
applies it to the logits before the draw.

Host side (`fill_masks`). A constrained sample row gets the next free row of the step's
`token_mask` buffer (in its IO set, packed int32 words) and `mask_row` points at it; every other
row says -1. Only the used rows travel to the device, after the step's other inputs. The matcher of
a sequence must have accepted every token drawn before the one being drawn: in async mode the
token of step N reaches the host while step N+1 is being prepared, so the engine waits for step N
just before it fills N+1's masks (replica/engine_core.py); a step with no constrained row whose
previous token is in flight never waits, and a step with no constrained row does nothing here.

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


def fill_masks(seqs: list[Sequence], rows: list[int], arrays: dict[str, np.ndarray], mask, grammars) -> int:
    """Point each constrained row at its mask row and fill those; returns the mask rows used.
    `mask` is the IO set's host `token_mask` array, `grammars` the engine's GrammarCompiler."""
    live = [r for r in rows if not seqs[r].grammar_done]  # one may have ended since the plan
    for k, r in enumerate(live):
        arrays["mask_row"][r] = k
    if live:
        grammars.fill([seqs[r].matcher for r in live], mask[: len(live)])
    return len(live)


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
