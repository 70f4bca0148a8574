"""The sampling part of a step on the device: logits, penalties, bias, the draw, logprobs, forks.

Two kinds of step (and of CUDA graph): "greedy" (every row a plain argmax of the raw logits, no
sequence keeps penalty counts: the fastest) and "sample" (any mix of rows: penalties, logit_bias,
min_tokens bans, temperature, top-k/top-p/min-p, seeds, logprobs). Every per-row parameter is read
from the step's IO buffer on the device, so a graph replays any mix; bias entries past the step's
count are masked in graphs (GRAPH_BIAS_ENTRIES at most per graphed step; a step with more runs
eagerly).

Logprobs describe the model's own distribution: log_softmax of the raw logits, before penalties,
bias, temperature and filters (vLLM's default, "raw_logprobs"). They are part of the sample kind,
so a step where one row in five asks replays the same graphs as one where none does: each row's
`logprob_k` (-1: it did not ask) tells the kernel (replica/triton_logprobs.py) which rows to score,
and a row that did not ask costs a program that returns at once. Eager steps score only when some
row asked; the host copies the logprob arrays back only then.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replica.grammar_masks import apply_token_masks
from replica.io_buffers import StepBuffers
from replica.kv_quant import copy_blocks
from replica.llama import LlamaForCausalLM
from replica.penalty_state import PenaltyState
from replica.sampler import SamplingTensors, sample
from replica.sampling_params import MAX_LOGPROBS
from replica.step_inputs import PromptLogprobChunk, StepLayout

GRAPH_BIAS_ENTRIES = 4096
PROMPT_LOGPROB_ROWS = 256  # rows of prompt logits at a time (a 128k vocabulary: 128 MB in float32)


@dataclass
class PromptScores:
    """A chunk's prompt logprobs on their way to the host: the next token's logprob at each position,
    and the top-k ids and logprobs."""

    chunk: PromptLogprobChunk
    logprob: torch.Tensor
    top_ids: torch.Tensor
    top_logprobs: torch.Tensor


class StepSampler:
    def __init__(self, model: LlamaForCausalLM, device: torch.device, max_seqs: int) -> None:
        self.model = model
        self.vocab = model.config.vocab_size
        self.penalties = PenaltyState(max_seqs, self.vocab, device)
        self._bias_slots = torch.arange(GRAPH_BIAS_ENTRIES, device=device)

    def graph_bias_ok(self, layout: StepLayout) -> bool:
        return layout.num_bias <= GRAPH_BIAS_ENTRIES

    # ---- around the forward (eager, on the compute stream) -------------------------------------------
    def before(self, dev: dict[str, torch.Tensor], layout: StepLayout) -> None:
        if layout.num_resets:
            self.penalties.reset(dev["reset_slots"][: layout.num_resets])

    def after(self, dev: dict[str, torch.Tensor], layout: StepLayout, kv_caches) -> None:
        """Forks: copy the parent's partial last block and its prompt row (the step wrote both)."""
        n = layout.num_copies
        if n:
            src, dst = dev["copy_src"][:n], dev["copy_dst"][:n]
            for k_cache, v_cache in kv_caches:  # bytes: an FP8 cache has no float8 index_copy_
                copy_blocks(k_cache, src, dst)
                copy_blocks(v_cache, src, dst)
        if layout.num_row_copies:
            rows = slice(0, layout.num_row_copies)
            self.penalties.copy_rows(dev["row_copy_src"][rows], dev["row_copy_dst"][rows])

    # ---- the draw (graphed or eager) ---------------------------------------------------------------------
    def draw(
        self,
        buf: StepBuffers,
        hidden: torch.Tensor,
        marks: int,
        logprobs: bool,
        num_bias: int | None,
        num_masks: int | None = None,
    ) -> None:
        """Sample every row of `hidden` into the set's outputs. `marks`: token rows whose penalty
        bookkeeping runs first; `logprobs`: score the rows whose `logprob_k` >= 0 (graphs always
        do); `num_bias`: the step's bias entries, or None in a graph (masked); `num_masks`: the
        step's grammar-constrained rows, or None in a graph (the kernel always runs, idle on
        unconstrained rows)."""
        dev = buf.dev
        rows = hidden.shape[0]
        if marks:
            self.penalties.mark(dev["mark_index"][:marks], dev["count_index"][:marks])
        raw = self.model.lm_head(hidden)
        slots = dev["penalty_slot"][:rows]
        logits = self.penalties.process(
            raw, slots, dev["repetition_penalty"][:rows], dev["frequency_penalty"][:rows],
            dev["presence_penalty"][:rows],
        )  # fmt: skip
        if logits.data_ptr() == raw.data_ptr():  # float32 model, no penalties (CPU): bias and masks
            logits = logits.clone()  # write in place below, and logprobs read the raw logits
        self._add_bias(logits, dev, num_bias)
        if num_masks is None or num_masks:
            apply_token_masks(logits, dev["mask_row"][:rows], dev["token_mask"])
        params = SamplingTensors(
            temperature=dev["temperature"][:rows], top_k=dev["top_k"][:rows], top_p=dev["top_p"][:rows],
            min_p=dev["min_p"][:rows], seed=dev["seed"][:rows], position=dev["out_position"][:rows],
        )  # fmt: skip
        tokens = sample(logits, params)
        buf.samples_dev[:rows].copy_(tokens)
        self.penalties.count_samples(slots, tokens)
        if logprobs:
            self._logprobs(raw, tokens, dev["logprob_k"][:rows], buf.out.dev)

    def _add_bias(self, logits: torch.Tensor, dev: dict[str, torch.Tensor], num_bias: int | None) -> None:
        flat = logits.view(-1)
        if num_bias is not None:  # eager: the exact entries
            if num_bias:
                flat.scatter_add_(0, dev["bias_index"][:num_bias], dev["bias_value"][:num_bias])
            return
        # Graph: a fixed number of entries; those past the step's count add 0 to distinct elements.
        n = self._bias_slots.shape[0]
        used = self._bias_slots < dev["num_bias"]
        index = torch.where(used, dev["bias_index"][:n], self._bias_slots % flat.shape[0])
        flat.scatter_add_(0, index, torch.where(used, dev["bias_value"][:n], 0.0))

    def _logprobs(
        self, raw: torch.Tensor, tokens: torch.Tensor, want: torch.Tensor, out: dict[str, torch.Tensor]
    ) -> None:
        """Each asking row's chosen-token logprob and top MAX_LOGPROBS, from the raw logits."""
        if raw.is_cuda:
            from replica.triton_logprobs import logprob_rows

            logprob_rows(raw, tokens, want, out)
            return
        # The reference (the CPU's): every row, in float32; the host reads only the rows that asked.
        rows = raw.shape[0]
        logits = raw.float()
        norm = torch.logsumexp(logits, dim=-1)
        out["logprob"][:rows].copy_(logits.gather(1, tokens[:, None])[:, 0] - norm)
        k = min(MAX_LOGPROBS, self.vocab)
        values, ids = logits.topk(k, dim=-1)
        out["top_logprobs"][:rows, :k].copy_(values - norm[:, None])
        out["top_ids"][:rows, :k].copy_(ids)

    # ---- prompt logprobs (eager steps only) -----------------------------------------------------------
    def score_prompts(
        self, hidden: torch.Tensor, dev: dict[str, torch.Tensor], chunks: list[PromptLogprobChunk]
    ) -> list[PromptScores]:
        return [self._score(hidden, dev, chunk) for chunk in chunks]

    def _score(self, hidden: torch.Tensor, dev: dict[str, torch.Tensor], chunk: PromptLogprobChunk):
        k = min(max(chunk.seq.params.prompt_logprobs, 1), self.vocab)
        parts = []
        for at in range(chunk.row, chunk.row + chunk.count, PROMPT_LOGPROB_ROWS):
            end = min(at + PROMPT_LOGPROB_ROWS, chunk.row + chunk.count)
            logits = self.model.lm_head(hidden[at:end]).float()
            norm = torch.logsumexp(logits, dim=-1)
            target = logits.gather(1, dev["target_ids"][at:end, None])[:, 0] - norm
            values, ids = logits.topk(k, dim=-1)
            parts.append((target, ids, values - norm[:, None]))
        logprob, ids, top = (torch.cat(p) for p in zip(*parts, strict=True))
        return PromptScores(chunk, logprob, ids, top)
