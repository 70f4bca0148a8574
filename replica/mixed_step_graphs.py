"""The mixed-step CUDA graphs of one runner, and which of them (if any) runs a step.

Fresh-chunk graphs (every chunk starts its sequence) per step kind, at each token rung; context
graphs (some chunk continues its sequence) per (kind, gathered-key rung), at token rungs up to
`mixed_graphs.CONTEXT_TOKENS`. See mixed_graphs.py for what a graph computes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

import replica.mixed_graphs as mixed
from replica.cuda_graphs import DecodeGraphs
from replica.step_inputs import StepLayout

MIXED_KINDS = ("greedy", "sample")  # logprob rows are sample rows (replica/step_sampler.py)
StepFn = Callable[[str, int, int, int], None]  # (kind, context keys, set index, tokens): one graph body


class MixedStepGraphs:
    def __init__(self, step_fn: StepFn, max_tokens: int, max_seqs: int, max_context_keys: int) -> None:
        self.step_fn = step_fn
        self.max_tokens = max_tokens
        self.max_seqs = max_seqs
        self.context_rungs = mixed.context_ladder(max_context_keys)
        self.fresh: dict[str, DecodeGraphs] = {}
        self.context: dict[tuple[str, int], DecodeGraphs] = {}

    def capture(self, stream: torch.cuda.Stream) -> None:
        ladder = mixed.token_ladder(self.max_tokens)
        for kind in MIXED_KINDS:
            self.fresh[kind] = DecodeGraphs(self._body(kind, 0), self.max_tokens, ladder)
            self.fresh[kind].capture(stream)
        pool = torch.cuda.graph_pool_handle()  # context graphs: largest context first, one pool
        top = min(self.max_tokens, mixed.CONTEXT_TOKENS)
        for keys in reversed(self.context_rungs):
            for kind in MIXED_KINDS:
                graphs = DecodeGraphs(self._body(kind, keys), top, mixed.token_ladder(top))
                graphs.capture(stream, pool)
                self.context[(kind, keys)] = graphs

    def _body(self, kind: str, keys: int) -> Callable[[int, int], None]:
        return lambda set_index, tokens: self.step_fn(kind, keys, set_index, tokens)

    @property
    def replays(self) -> int:
        return sum(g.replays for g in (*self.fresh.values(), *self.context.values()))

    @property
    def context_replays(self) -> int:
        """Mixed steps whose chunks continued their sequences, run by context graphs."""
        return sum(g.replays for g in self.context.values())

    def choose(self, layout: StepLayout, kind: str, graph_bias_ok: bool) -> tuple[int | None, int]:
        """The token rung and context rung (0: fresh chunks only) a graph runs the step at;
        (None, 0): no graph fits, the step runs eagerly."""
        eager = None, 0
        if kind not in self.fresh or not mixed.fits(layout.prefills):
            return eager
        if layout.prompt_logprobs or not graph_bias_ok:
            return eager
        keys = mixed.context_keys(layout.prefills)
        if keys and layout.grammar_rows:  # constrained steps graph fresh chunks only (split_steps.py)
            return eager
        rung = next((r for r in self.context_rungs if r >= keys), None) if keys else 0
        graphs = self.context.get((kind, rung)) if keys else self.fresh[kind]
        size = graphs.padded_size(layout.num_tokens) if graphs is not None else None
        if size is None or layout.num_samples > mixed.graph_rows(size, self.max_seqs):
            return eager
        return size, rung

    def replay(self, kind: str, set_index: int, tokens: int, context: int) -> None:
        graphs = self.context[(kind, context)] if context else self.fresh[kind]
        graphs.replay(set_index, tokens)
