"""Runs one planned step on the device: copy inputs in, forward, sample, copy tokens out.

`launch` only enqueues work (on CUDA) and returns a handle; `wait` blocks on that step's D2H event
and returns the sampled ids. The engine launches step N+1 before it waits for step N, so host and
device overlap. A token that step N samples reaches step N+1 on the device: its input row names
the source row in N's samples (`prev_rows`) and a gather fills it in before the forward.

Streams: H2D copies run on the H2D stream; the compute stream waits for the H2D event, runs the
forward and sampler (a CUDA graph for decode steps and for mixed steps of new prompts) and records
compute_done; the D2H stream waits for that and copies the samples to pinned memory. The host
waits only on D2H events.

Every step is one of two kinds (replica/step_sampler.py), "greedy" or "sample", each with its own
graphs, so sampled traffic replays graphs as greedy traffic does; rows that ask for logprobs are
sample rows, scored inside the same graphs. A step is reported as "logprobs" when some row asked
(its logprob arrays come back to the host).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

import replica.mixed_graphs as mixed
from replica.architectures import check_cuda_head_dim
from replica.attention_metadata import AttentionMetadata, DecodeKernelShape, PrefillChunk
from replica.cuda_graphs import DecodeGraphs
from replica.generation_defaults import MAX_EOS_IDS
from replica.grammar_masks import assign_mask_rows
from replica.io_buffers import StepBuffers
from replica.lazy_memory import lazy_zeros
from replica.llama import LlamaForCausalLM
from replica.lora_ops import attach_lora
from replica.lora_slots import LoraSlots
from replica.lora_step import buffer_rows, fill_lora
from replica.mixed_step_graphs import MixedStepGraphs
from replica.sampling_params import MAX_LOGIT_BIAS, MAX_STOP_TOKEN_IDS
from replica.scheduler import StepPlan
from replica.split_steps import SplitSteps
from replica.step_handle import StepHandle, StepResult, prompt_scores_to_host
from replica.step_inputs import FillContext, StepLayout, fill_step
from replica.step_sampler import GRAPH_BIAS_ENTRIES, PromptScores, StepSampler
from replica.streams import StepStreams
from replica.varlen_prefill import flash_varlen_available

KINDS = ("greedy", "sample")  # a grammar-constrained row is never "greedy"
MAX_BAN_IDS = MAX_STOP_TOKEN_IDS + MAX_EOS_IDS  # stop ids plus the model's EOS ids
MaskFill = Callable[[StepLayout, StepBuffers], None]  # fills a constrained step's token masks


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        device: torch.device,
        num_blocks: int,
        block_size: int,
        max_tokens: int,
        max_seqs: int,
        max_model_len: int,
        cuda_graphs: bool = True,
        fused_kernels: bool = True,
        mixed_graphs: bool = True,
        decode_kernel: DecodeKernelShape = DecodeKernelShape(),
        k_slices: int = 0,
        triton_gemms: tuple[str, ...] = (),
        context_graphs: bool = False,
        lora: LoraSlots | None = None,
        kv_dtype: torch.dtype | None = None,  # None: the model dtype; float8_e4m3fn (replica/kv_quant.py)
    ) -> None:
        cfg = model.config
        if device.type == "cuda":
            check_cuda_head_dim(model.head_dim)
        self.model = model
        self.device = device
        self.block_size = block_size
        self.max_seqs = max_seqs
        self.table_width = -(-max_model_len // block_size)
        self.streams = StepStreams(device)
        dtype = next(model.parameters()).dtype
        shape = (num_blocks, block_size, cfg.num_key_value_heads, model.head_dim)
        cache = partial(lazy_zeros, shape, kv_dtype or dtype, device)  # CPU: pages on first write
        self.kv_caches = [(cache(), cache()) for _ in range(cfg.num_hidden_layers)]
        self.decode_backend = "triton" if device.type == "cuda" else "torch"
        self.decode_kernel = decode_kernel
        flash = flash_varlen_available(device, dtype, model.head_dim)
        self.prefill_backend = "flash" if flash else "torch"
        model.fused = device.type == "cuda" and fused_kernels
        model.k_slices = k_slices if model.fused and dtype in (torch.bfloat16, torch.float16) else 0
        model.triton_gemms = frozenset(triton_gemms) if model.k_slices >= 1 else frozenset()
        # Multi-LoRA: wrapped projections add each row's delta (replica/lora_ops.py); the K-slice
        # partials read the o/down weights directly and would skip it, so they are off with LoRA.
        self.lora = attach_lora(model, lora) if lora is not None else None
        if self.lora is not None:
            model.k_slices, model.triton_gemms = 0, frozenset()
        lora_rows = buffer_rows(max(max_tokens, max_seqs), lora.num_slots if lora is not None else 0)
        max_rows = max(max_tokens, max_seqs)
        bias = max(GRAPH_BIAS_ENTRIES, max_seqs * (MAX_LOGIT_BIAS + MAX_BAN_IDS))
        words = -(-cfg.vocab_size // 32)  # one packed token-mask row (structured output)
        chunks = mixed.MAX_CHUNKS  # what a mixed graph reads, however few sequences the engine runs
        self.buffers = [
            StepBuffers(device, max_rows, max_seqs, self.table_width, bias, words, lora_rows, chunks)
            for _ in (0, 1)
        ]
        self.sampler = StepSampler(model, device, max_seqs)
        pads = self.sampler.penalties.pad_row * cfg.vocab_size + np.arange(max_rows) % cfg.vocab_size
        self.fill_context = FillContext(block_size, cfg.vocab_size, pads.astype(np.int64))
        self._step_count = 0
        self._prev_valid = False  # whether the other set's samples hold the previous step's tokens
        self._last_compute_done = None
        self.split = SplitSteps(self)  # steps with grammar-constrained rows: forward, masks, draw
        self.graphs: dict[str, DecodeGraphs] = {}
        max_keys = min(num_blocks * block_size, mixed.MAX_CHUNKS * max_model_len) if context_graphs else 0
        self.mixed = MixedStepGraphs(self._mixed_graph_step, max_tokens, max_seqs, max_keys)
        if device.type == "cuda":
            # cuDNN's attention builds and compiles a plan for every new sequence length (hundreds of
            # ms each time a prompt length is first seen); flash and memory-efficient kernels are
            # compiled ahead. Process-wide, which suits a process that serves one engine.
            torch.backends.cuda.enable_cudnn_sdp(False)
            # Weights, caches and buffers were written on the default stream; the step streams do not
            # wait for it, so finish that work before any of them reads the memory (a reused block
            # could otherwise still hold a previous engine's bytes).
            torch.cuda.synchronize(device)
        if device.type == "cuda" and cuda_graphs:
            self._capture(max_seqs, max_tokens, mixed_graphs and self.prefill_backend == "flash")

    def _capture(self, max_seqs: int, max_tokens: int, with_mixed: bool) -> None:
        for kind in KINDS:
            self.graphs[kind] = DecodeGraphs(partial(self._graph_step, kind), max_seqs)
            self.graphs[kind].capture(self.streams.compute)
        if with_mixed:
            self.mixed.capture(self.streams.compute)
        self.split.capture(self.streams.compute, max_tokens, with_mixed)
        self.sampler.penalties.reset(torch.arange(max_seqs + 1, device=self.device))  # warm-up's writes
        torch.cuda.synchronize(self.device)

    @property
    def graph_replays(self) -> int:
        return sum(g.replays for g in self.graphs.values()) + self.split.forward_replays

    @property
    def mixed_replays(self) -> int:
        return self.mixed.replays + self.split.mixed_replays

    @staticmethod
    def kv_bytes_per_block(model: LlamaForCausalLM, block_size: int, dtype: torch.dtype) -> int:
        """Bytes of one block of every layer's K and V, `dtype` the cache's (FP8: half of bf16's)."""
        cfg = model.config
        per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * model.head_dim
        return per_token * block_size * torch.finfo(dtype).bits // 8

    def close(self) -> None:
        """Drop the device memory this runner holds (KV cache, IO buffers, graphs)."""
        self.kv_caches, self.buffers, self.graphs = [], [], {}
        self.mixed.fresh, self.mixed.context = {}, {}
        self.split.close()  # its graphs refer back to it: dropped here, not by a later GC pass
        self.sampler, self.split = None, None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    def reset_carry(self) -> None:
        """Forget the last step's samples (after a failed step nothing may read them)."""
        self._prev_valid = False

    @torch.inference_mode()
    def launch(self, plan: StepPlan, masks: MaskFill | None = None) -> StepHandle:
        """Fill the step's inputs and enqueue it. A step with grammar-constrained rows is enqueued in
        two parts (replica/split_steps.py): its forward, then `masks` fills the rows' token masks on
        the host while the device computes, then the masks' copy and the draw."""
        t0 = time.perf_counter()
        set_index = self._step_count % 2
        buf = self.buffers[set_index]
        layout = fill_step(plan, buf, self.fill_context)
        if layout.has_placeholders and not self._prev_valid:
            raise RuntimeError("a carried token has no previous step to come from")
        kind = "greedy" if layout.plain_greedy else "sample"
        graph_size = self._graph_size(layout, kind)
        mixed_size, context = (None, 0)
        if graph_size is None:
            mixed_size, context = self.mixed.choose(layout, kind, self.sampler.graph_bias_ok(layout))
        decode_rows = layout.num_decode  # decode-table rows the step's device work reads
        if graph_size is not None:
            self._pad_decode(buf, layout, graph_size)
            decode_rows = graph_size
        elif mixed_size is not None:
            decode_rows = mixed.graph_rows(mixed_size, self.max_seqs)
            mixed.pad_inputs(buf.np, layout, mixed_size, decode_rows, self.fill_context.pad_marks)
        if self.lora is not None:  # every row's slot, padding rows' -1, and the tiles
            fill_lora(plan, buf.np, graph_size or (mixed_size or layout.num_tokens))
        split = bool(layout.grammar_rows)
        if split:
            if masks is None:
                raise RuntimeError("a step with grammar-constrained rows needs their masks filled")
            graph_size, mixed_size = self.split.graph_sizes(kind, graph_size, mixed_size)
            layout.num_masks = assign_mask_rows(layout.grammar_rows, buf.np)
        prepare_ms = (time.perf_counter() - t0) * 1000.0
        names = ("start", "h2d_done", "masks_done", "compute_start", "compute_done", "d2h_done")
        events = {name: self.streams.event() for name in names}
        with self.streams.on("h2d"):
            events["start"].record()
            buf.copy_to_device(decode_rows, len(layout.prefills), layout.num_bias)
            events["h2d_done"].record()
        self.streams.wait("compute", events["h2d_done"])
        scores: list[PromptScores] = []
        with self.streams.on("compute"):
            events["compute_start"].record()
            self.sampler.before(buf.dev, layout)
            if split:
                hidden = self.split.forward(set_index, layout, graph_size, mixed_size)
            elif graph_size is not None:
                self.graphs[kind].replay(set_index, graph_size)
            elif mixed_size is not None:
                self.mixed.replay(kind, set_index, mixed_size, context)
            else:
                scores = self.eager_draw(set_index, layout, kind, self.eager_forward(set_index, layout))
        if split:  # the host fills the masks while the device runs the forward
            t1 = time.perf_counter()
            masks(layout, buf)
            prepare_ms += (time.perf_counter() - t1) * 1000.0
            with self.streams.on("h2d"):
                buf.copy_masks_to_device(layout.num_masks)
                events["masks_done"].record()
            self.streams.wait("compute", events["masks_done"])
            with self.streams.on("compute"):
                scores = self.split.draw(set_index, layout, kind, graph_size, mixed_size, hidden)
        with self.streams.on("compute"):
            self.sampler.after(buf.dev, layout, self.kv_caches)
            events["compute_done"].record()
        self.streams.wait("d2h", events["compute_done"])
        with self.streams.on("d2h"):
            buf.copy_samples_to_host(layout.num_samples, logprobs=layout.logprobs)
            scores = [prompt_scores_to_host(s, self.device) for s in scores]
            events["d2h_done"].record()
        self._step_count += 1
        self._prev_valid = True
        prev_done, self._last_compute_done = self._last_compute_done, events["compute_done"]
        graphed = graph_size is not None or mixed_size is not None
        label = "logprobs" if layout.logprobs else kind
        handle = StepHandle(
            plan, set_index, layout.num_samples, prepare_ms, graphed, events, prev_done, label
        )
        handle.prompt_scores = scores
        handle.masked_rows = layout.num_masks if split else 0
        # An eager step's kernels are enqueued one by one from Python: when this exceeds its device
        # time, the step is bound by the host (what CUDA graphs remove for decode steps).
        handle.launch_ms = (time.perf_counter() - t0) * 1000.0 - prepare_ms
        return handle

    def wait(self, handle: StepHandle) -> StepResult:
        """Block until the step's outputs are on the host; the engine's only planned wait."""
        handle.events["d2h_done"].synchronize()
        out = self.buffers[handle.set_index].out
        arrays = out.read(handle.num_samples, logprobs=handle.kind == "logprobs")
        return StepResult(*arrays, prompt_scores=handle.prompt_scores)

    # ---- device work ---------------------------------------------------------------------------------
    def _graph_size(self, layout: StepLayout, kind: str) -> int | None:
        pure_decode = layout.num_decode == layout.num_tokens
        if kind not in self.graphs or not pure_decode or not self.sampler.graph_bias_ok(layout):
            return None
        if layout.num_samples != layout.num_decode:  # a fork draws from its parent's row: not row i
            return None
        return self.graphs[kind].padded_size(layout.num_decode)

    def _pad_decode(self, buf: StepBuffers, layout: StepLayout, size: int) -> None:
        """Padded rows: token 0 at position 0 of the reserved block 0, sampling their own row greedily."""
        a = buf.np
        used = layout.num_decode
        pad = slice(used, size)
        for name in ("input_ids", "positions", "slot_mapping", "decode_tables"):
            a[name][pad] = 0
        a["prev_rows"][pad] = -1
        a["decode_lens"][pad] = 1
        a["sample_rows"][:size] = np.arange(size)
        mixed.pad_samples(a, layout.num_samples, size)

    def carried_ids(self, set_index: int, count: int) -> torch.Tensor:
        dev = self.buffers[set_index].dev
        if self.lora is not None:  # every forward takes its ids here: its adapter rows are bound too
            self.lora.bind(dev, count)
        source = self.buffers[1 - set_index].samples_dev
        prev = dev["prev_rows"][:count]
        return torch.where(prev >= 0, source[prev.clamp(min=0)], dev["input_ids"][:count])

    def draw(
        self,
        kind: str,
        buf: StepBuffers,
        hidden: torch.Tensor,
        marks: int,
        num_bias: int | None,
        num_masks: int | None = None,
        logprobs: bool = False,
    ) -> None:
        """`logprobs`: score the rows that asked (graphs of the sample kind always do)."""
        if kind == "greedy":  # the same kernel in graphs and eager steps, so every step picks alike
            buf.samples_dev[: hidden.shape[0]].copy_(self.model.greedy_tokens(hidden))
        else:
            self.sampler.draw(buf, hidden, marks, logprobs, num_bias, num_masks)

    def decode_metadata(self, dev: dict[str, torch.Tensor], size: int) -> AttentionMetadata:
        """The attention inputs of a padded pure-decode step of `size` rows (graphs)."""
        return AttentionMetadata(
            slot_mapping=dev["slot_mapping"][:size], num_decode=size,
            decode_block_tables=dev["decode_tables"][:size], decode_context_lens=dev["decode_lens"][:size],
            prefills=[], decode_backend=self.decode_backend, decode_kernel=self.decode_kernel,
        )  # fmt: skip

    def _graph_step(self, kind: str, set_index: int, size: int) -> None:
        """The captured body of a padded pure-decode step."""
        buf = self.buffers[set_index]
        dev = buf.dev
        meta = self.decode_metadata(dev, size)
        hidden = self.model(self.carried_ids(set_index, size), dev["positions"][:size], self.kv_caches, meta)
        self.draw(kind, buf, hidden, 0, None, logprobs=True)

    def _mixed_graph_step(self, kind: str, context: int, set_index: int, tokens: int) -> None:
        """The captured body of a mixed step padded to `tokens`, gathering `context` keys when its
        chunks continue their sequences (see mixed_graphs.py)."""
        buf = self.buffers[set_index]
        dev = buf.dev
        rows = mixed.graph_rows(tokens, self.max_seqs)
        meta = mixed.metadata(dev, tokens, rows, self.decode_kernel, context, self.block_size)
        hidden = self.model(
            self.carried_ids(set_index, tokens), dev["positions"][:tokens], self.kv_caches, meta
        )
        self.draw(kind, buf, hidden[dev["sample_rows"][:rows]], tokens, None, logprobs=True)

    def eager_forward(self, set_index: int, layout: StepLayout) -> torch.Tensor:
        """The forward of a step no graph fits, op by op; returns every token row's hidden state."""
        dev = self.buffers[set_index].dev
        t, nd = layout.num_tokens, layout.num_decode
        width = layout.decode_width if self.decode_backend == "torch" else self.table_width
        n = len(layout.prefills)
        meta = AttentionMetadata(
            slot_mapping=dev["slot_mapping"][:t], num_decode=nd,
            decode_block_tables=dev["decode_tables"][:nd, :width],
            decode_context_lens=dev["decode_lens"][:nd],
            prefills=[PrefillChunk(q, n, ctx, dev["prefill_tables"][r]) for q, n, ctx, r in layout.prefills],
            decode_backend=self.decode_backend, prefill_backend=self.prefill_backend,
            decode_kernel=self.decode_kernel,
            prefill_cu_q=dev["prefill_cu_q"][: n + 1], prefill_cu_k=dev["prefill_cu_k"][: n + 1],
            prefill_max_q=layout.prefill_max_q, prefill_max_k=layout.prefill_max_k,
        )  # fmt: skip
        input_ids = self.carried_ids(set_index, t) if layout.has_placeholders else dev["input_ids"][:t]
        if self.lora is not None:
            self.lora.bind(dev, t)
        return self.model(input_ids, dev["positions"][:t], self.kv_caches, meta)

    def eager_draw(
        self, set_index: int, layout: StepLayout, kind: str, hidden: torch.Tensor
    ) -> list[PromptScores]:
        """The draw of a step no graph fits, from its forward's hidden states, and its prompt scores."""
        buf = self.buffers[set_index]
        dev = buf.dev
        marks = layout.num_tokens if layout.marks else 0
        rows = dev["sample_rows"][: layout.num_samples]
        self.draw(kind, buf, hidden[rows], marks, layout.num_bias, layout.num_masks, layout.logprobs)
        return self.sampler.score_prompts(hidden, dev, layout.prompt_logprobs)
