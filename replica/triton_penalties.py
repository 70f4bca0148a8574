"""The penalties' CUDA kernel: a row's logits cast to float32 with its penalties applied in one pass.

Rows with penalties read their counts and prompt flags from the penalty state
(replica/penalty_state.py): the repetition penalty divides positive logits and multiplies negative
ones of tokens seen in the prompt or the output; frequency and presence subtract from tokens seen in
the output. Rows without (slot -1) are only cast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _penalty_kernel(
    raw_ptr, raw_stride, out_ptr, vocab, slot_ptr, rep_ptr, freq_ptr, pres_ptr, counts_ptr, prompt_ptr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    ids = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = ids < vocab
    x = tl.load(raw_ptr + row * raw_stride + ids, mask=inside, other=0.0).to(tl.float32)
    slot = tl.load(slot_ptr + row)
    if slot >= 0:
        seen = tl.load(counts_ptr + slot * vocab + ids, mask=inside, other=0)
        in_prompt = tl.load(prompt_ptr + slot * vocab + ids, mask=inside, other=0)
        rep = tl.load(rep_ptr + row)
        present = (seen > 0) | (in_prompt != 0)
        x = tl.where(present, tl.where(x > 0, x / rep, x * rep), x)
        appeared = tl.where(seen > 0, 1.0, 0.0)
        x = x - (tl.load(freq_ptr + row) * seen.to(tl.float32) + tl.load(pres_ptr + row) * appeared)
    tl.store(out_ptr + row * vocab + ids, x, mask=inside)


def penalized_logits(
    raw: torch.Tensor,
    slots: torch.Tensor,
    repetition: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
    counts: torch.Tensor,
    prompt: torch.Tensor,
) -> torch.Tensor:
    rows, vocab = raw.shape
    out = torch.empty((rows, vocab), dtype=torch.float32, device=raw.device)
    if rows == 0:
        return out
    grid = (rows, triton.cdiv(vocab, 4096))
    _penalty_kernel[grid](
        raw, raw.stride(0), out, vocab, slots, repetition, frequency, presence, counts, prompt, BLOCK=4096
    )
    return out
