"""Steps with grammar-constrained rows run in two parts: the forward, then the draw.

A constrained row's token mask needs the token its sequence drew in the step before, which in
async mode is still on the device when the next step is launched. Launched whole, such a step
would wait for that token, feed it to the matcher and fill the masks before anything of it is
enqueued, with the device idle all the while (about 14 ms a step for 126 rows of a 128k vocabulary
on the H200's host). So the runner enqueues the forward first (it needs no mask: its input tokens
come from the previous step's samples on the device), lets the engine catch the matchers up and
fill the masks while the device computes it, copies the masks, then enqueues the draw (lm_head,
penalties, bias, masks, sampling) from the hidden states the forward left.

With CUDA graphs the two parts are graphs of their own: a forward graph per (IO set, batch size)
for pure decode steps and per (IO set, token rung) for mixed steps, which writes the sampled rows'
hidden states into a fixed buffer of its IO set, and a draw graph per (kind, IO set, rows) that
reads them. A mixed step's penalty bookkeeping of prompt tokens runs in its forward graph (it only
has to precede the draw). Steps no graph fits run both parts eagerly.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

import replica.mixed_graphs as mixed
from replica.cuda_graphs import DecodeGraphs
from replica.step_inputs import StepLayout
from replica.step_sampler import PromptScores

DRAW_KINDS = ("sample",)  # a constrained row is never "greedy"


class SplitSteps:
    def __init__(self, runner: Any) -> None:
        """`runner`: the ModelRunner that owns these graphs (not imported: it imports this module)."""
        self.runner = runner
        model = runner.model
        dtype = next(model.parameters()).dtype
        shape = (runner.max_seqs, model.config.hidden_size)
        # The sampled rows' hidden states, from the forward to the draw (one buffer per IO set).
        self.hidden = [torch.zeros(shape, dtype=dtype, device=runner.device) for _ in (0, 1)]
        self.forward_graphs: DecodeGraphs | None = None
        self.mixed_forward_graphs: DecodeGraphs | None = None
        self.draw_graphs: dict[str, DecodeGraphs] = {}

    def capture(self, stream: torch.cuda.Stream, max_tokens: int, with_mixed: bool) -> None:
        max_seqs = self.runner.max_seqs
        self.forward_graphs = DecodeGraphs(self._decode_forward, max_seqs)
        self.forward_graphs.capture(stream)
        if with_mixed:
            ladder = mixed.token_ladder(max_tokens)
            self.mixed_forward_graphs = DecodeGraphs(self._mixed_forward, max_tokens, ladder)
            self.mixed_forward_graphs.capture(stream)
        for kind in DRAW_KINDS:
            self.draw_graphs[kind] = DecodeGraphs(partial(self._graph_draw, kind), max_seqs)
            self.draw_graphs[kind].capture(stream)

    def close(self) -> None:
        """Drop the graphs and buffers now. Each graph's body is a bound method of this object, a
        reference cycle: left to the cycle collector, the graphs would be destroyed at some later
        moment, possibly while another engine in the process captures its own (which breaks it)."""
        self.forward_graphs = self.mixed_forward_graphs = None
        self.draw_graphs, self.hidden = {}, []

    @property
    def forward_replays(self) -> int:
        return self.forward_graphs.replays if self.forward_graphs else 0

    @property
    def mixed_replays(self) -> int:
        return self.mixed_forward_graphs.replays if self.mixed_forward_graphs else 0

    def graph_sizes(
        self, kind: str, decode: int | None, mixed_tokens: int | None
    ) -> tuple[int | None, int | None]:
        """The (decode batch, mixed token rung) the graphs run this step at; (None, None): eager.
        `decode` and `mixed_tokens` are what the whole-step graphs would have run."""
        draw = self.draw_graphs.get(kind)
        if draw is None:
            return None, None
        if decode is not None and self.forward_graphs is not None:
            return decode, None
        mixed_ok = mixed_tokens is not None and self.mixed_forward_graphs is not None
        if mixed_ok and mixed.graph_rows(mixed_tokens, self.runner.max_seqs) in draw.sizes:
            return None, mixed_tokens
        return None, None

    def forward(
        self, set_index: int, layout: StepLayout, decode: int | None, mixed_tokens: int | None
    ) -> torch.Tensor | None:
        """Enqueue the forward; returns the hidden states of an eager forward (graphs keep theirs)."""
        if decode is not None:
            self.forward_graphs.replay(set_index, decode)
            return None
        if mixed_tokens is not None:
            self.mixed_forward_graphs.replay(set_index, mixed_tokens)
            return None
        return self.runner.eager_forward(set_index, layout)

    def draw(
        self,
        set_index: int,
        layout: StepLayout,
        kind: str,
        decode: int | None,
        mixed_tokens: int | None,
        hidden: torch.Tensor | None,
    ) -> list[PromptScores]:
        """Enqueue the draw (after the masks' copy); returns the prompt scores of an eager step."""
        if decode is not None:
            self.draw_graphs[kind].replay(set_index, decode)
            return []
        if mixed_tokens is not None:
            self.draw_graphs[kind].replay(set_index, mixed.graph_rows(mixed_tokens, self.runner.max_seqs))
            return []
        return self.runner.eager_draw(set_index, layout, kind, hidden)

    # ---- captured bodies --------------------------------------------------------------------------
    def _decode_forward(self, set_index: int, size: int) -> None:
        runner = self.runner
        dev = runner.buffers[set_index].dev
        meta = runner.decode_metadata(dev, size)
        ids = runner.carried_ids(set_index, size)
        hidden = runner.model(ids, dev["positions"][:size], runner.kv_caches, meta)
        self.hidden[set_index][:size].copy_(hidden)

    def _mixed_forward(self, set_index: int, tokens: int) -> None:
        runner = self.runner
        dev = runner.buffers[set_index].dev
        rows = mixed.graph_rows(tokens, runner.max_seqs)
        runner.sampler.penalties.mark(dev["mark_index"][:tokens], dev["count_index"][:tokens])
        meta = mixed.metadata(dev, tokens, rows, runner.decode_kernel)
        ids = runner.carried_ids(set_index, tokens)
        hidden = runner.model(ids, dev["positions"][:tokens], runner.kv_caches, meta)
        self.hidden[set_index][:rows].copy_(hidden[dev["sample_rows"][:rows]])

    def _graph_draw(self, kind: str, set_index: int, size: int) -> None:
        runner = self.runner
        runner.draw(kind, runner.buffers[set_index], self.hidden[set_index][:size], 0, None, logprobs=True)
