"""Runs one planned step on the device: copy inputs in, forward, sample, copy tokens out.

`launch` only enqueues work (on CUDA) and returns a handle; `wait` blocks on that step's D2H event
and returns the sampled ids. The engine launches step N+1 before it waits for step N, so host and
device overlap. A token that step N samples reaches step N+1 on the device: its input row names
the source row in N's samples (`prev_rows`) and a gather fills it in before the forward.

Streams: H2D copies run on the H2D stream; the compute stream waits for the H2D event, runs the
forward and sampler (a CUDA graph for pure greedy decodes) and records compute_done; the D2H
stream waits for that and copies the samples to pinned memory. The host waits only on D2H events.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from replica import mixed_graphs as mixed
from replica.attention import AttentionMetadata, DecodeKernelShape, PrefillChunk
from replica.cuda_graphs import DecodeGraphs
from replica.io_buffers import StepBuffers
from replica.llama import LlamaForCausalLM
from replica.sampler import SamplingTensors, sample
from replica.scheduler import StepPlan
from replica.step_inputs import StepLayout, fill_step
from replica.streams import StepStreams
from replica.varlen_prefill import flash_varlen_available


@dataclass
class StepHandle:
    plan: StepPlan
    set_index: int
    num_samples: int
    prepare_ms: float
    graphed: bool
    events: dict  # start, h2d_done, compute_start, compute_done, d2h_done
    prev_compute_done: object | None  # the previous step's compute_done: the gap since is device idle
    launch_ms: float = 0.0  # host time to enqueue the step's copies, forward and sampling
    idle_ms: float = 0.0  # host time the loop waited for work before launching this step
    schedule_ms: float = 0.0  # host time the scheduler took to plan this step

    def timings_ms(self) -> dict[str, float]:
        ev = self.events
        gap = 0.0
        if self.prev_compute_done is not None:
            gap = max(0.0, self.prev_compute_done.elapsed_time(ev["compute_start"]))
        return {
            "prepare_ms": self.prepare_ms,
            "launch_ms": self.launch_ms,
            "h2d_ms": ev["start"].elapsed_time(ev["h2d_done"]),
            "compute_ms": ev["compute_start"].elapsed_time(ev["compute_done"]),
            "d2h_ms": ev["compute_done"].elapsed_time(ev["d2h_done"]),
            "gap_ms": gap,
        }


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
    ) -> None:
        cfg = model.config
        self.model = model
        self.device = device
        self.block_size = block_size
        self.max_seqs = max_seqs
        self.table_width = -(-max_model_len // block_size)
        self.streams = StepStreams(device)
        dtype = next(model.parameters()).dtype
        shape = (num_blocks, block_size, cfg.num_key_value_heads, model.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.num_hidden_layers)
        ]
        self.decode_backend = "triton" if device.type == "cuda" else "torch"
        self.decode_kernel = decode_kernel
        flash = flash_varlen_available(device, dtype, model.head_dim)
        self.prefill_backend = "flash" if flash else "torch"
        model.fused = device.type == "cuda" and fused_kernels
        model.k_slices = k_slices if model.fused and dtype in (torch.bfloat16, torch.float16) else 0
        model.triton_gemms = frozenset(triton_gemms) if model.k_slices >= 1 else frozenset()
        self.buffers = [
            StepBuffers(device, max(max_tokens, max_seqs), max_seqs, self.table_width) for _ in (0, 1)
        ]
        self._step_count = 0
        self._prev_valid = False  # whether the other set's samples hold the previous step's tokens
        self._last_compute_done = None
        self.graphs: DecodeGraphs | None = None
        self.mixed_graphs: DecodeGraphs | None = None  # mixed steps, at a ladder of token counts
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
            self.graphs = DecodeGraphs(self._graph_step, max_seqs)
            self.graphs.capture(self.streams.compute)
        if device.type == "cuda" and cuda_graphs and mixed_graphs and self.prefill_backend == "flash":
            ladder = mixed.token_ladder(max_tokens)
            self.mixed_graphs = DecodeGraphs(self._mixed_graph_step, max_tokens, ladder=ladder)
            self.mixed_graphs.capture(self.streams.compute)

    @staticmethod
    def kv_bytes_per_block(model: LlamaForCausalLM, block_size: int, dtype: torch.dtype) -> int:
        cfg = model.config
        per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * model.head_dim
        return per_token * block_size * torch.finfo(dtype).bits // 8

    def close(self) -> None:
        """Drop the device memory this runner holds (KV cache, IO buffers, graphs)."""
        self.kv_caches, self.buffers, self.graphs, self.mixed_graphs = [], [], None, None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    def reset_carry(self) -> None:
        """Forget the last step's samples (after a failed step nothing may read them)."""
        self._prev_valid = False

    @torch.inference_mode()
    def launch(self, plan: StepPlan) -> StepHandle:
        t0 = time.perf_counter()
        set_index = self._step_count % 2
        buf = self.buffers[set_index]
        layout = fill_step(plan, buf, self.block_size)
        if layout.has_placeholders and not self._prev_valid:
            raise RuntimeError("a carried token has no previous step to come from")
        graph_size = self._graph_size(layout)
        mixed_size = self._mixed_size(layout) if graph_size is None else None
        decode_rows = layout.num_decode  # decode-table rows the step's device work reads
        if graph_size is not None:
            self._pad_decode(buf, layout.num_decode, graph_size)
            decode_rows = graph_size
        elif mixed_size is not None:
            decode_rows = mixed.graph_rows(mixed_size, self.max_seqs)
            mixed.pad_inputs(buf.np, layout, mixed_size, decode_rows)
        prepare_ms = (time.perf_counter() - t0) * 1000.0
        names = ("start", "h2d_done", "compute_start", "compute_done", "d2h_done")
        events = {name: self.streams.event() for name in names}
        with self.streams.on("h2d"):
            events["start"].record()
            buf.copy_to_device(decode_rows, len(layout.prefills))
            events["h2d_done"].record()
        self.streams.wait("compute", events["h2d_done"])
        with self.streams.on("compute"):
            events["compute_start"].record()
            if graph_size is not None:
                self.graphs.replay(set_index, graph_size)
            elif mixed_size is not None:
                self.mixed_graphs.replay(set_index, mixed_size)
            else:
                self._eager_step(set_index, layout)
            events["compute_done"].record()
        self.streams.wait("d2h", events["compute_done"])
        with self.streams.on("d2h"):
            buf.copy_samples_to_host(layout.num_samples)
            events["d2h_done"].record()
        self._step_count += 1
        self._prev_valid = True
        prev_done, self._last_compute_done = self._last_compute_done, events["compute_done"]
        graphed = graph_size is not None or mixed_size is not None
        handle = StepHandle(plan, set_index, layout.num_samples, prepare_ms, graphed, events, prev_done)
        # An eager step's kernels are enqueued one by one from Python: when this exceeds its device
        # time, the step is bound by the host (what CUDA graphs remove for decode steps).
        handle.launch_ms = (time.perf_counter() - t0) * 1000.0 - prepare_ms
        return handle

    def wait(self, handle: StepHandle) -> np.ndarray:
        """Block until the step's tokens are on the host; the engine's only planned wait."""
        handle.events["d2h_done"].synchronize()
        return self.buffers[handle.set_index].samples_host.numpy()[: handle.num_samples]

    # ---- device work ---------------------------------------------------------------------------------
    def _graph_size(self, layout: StepLayout) -> int | None:
        pure_decode = layout.num_decode == layout.num_tokens
        if self.graphs is None or not pure_decode or not layout.all_greedy:
            return None
        return self.graphs.padded_size(layout.num_decode)

    def _mixed_size(self, layout: StepLayout) -> int | None:
        if self.mixed_graphs is None or not mixed.eligible(layout.prefills, layout.all_greedy):
            return None
        return self.mixed_graphs.padded_size(layout.num_tokens)

    def _pad_decode(self, buf: StepBuffers, used: int, size: int) -> None:
        """Padded rows: token 0 at position 0 of the reserved block 0, sampling their own row."""
        a = buf.np
        pad = slice(used, size)
        for name in ("input_ids", "positions", "slot_mapping", "decode_tables"):
            a[name][pad] = 0
        a["prev_rows"][pad] = -1
        a["decode_lens"][pad] = 1
        a["sample_rows"][:size] = np.arange(size)

    def _carried_ids(self, set_index: int, count: int) -> torch.Tensor:
        dev = self.buffers[set_index].dev
        source = self.buffers[1 - set_index].samples_dev
        prev = dev["prev_rows"][:count]
        return torch.where(prev >= 0, source[prev.clamp(min=0)], dev["input_ids"][:count])

    def _graph_step(self, set_index: int, size: int) -> None:
        """The captured body: a padded, all-greedy, pure-decode step."""
        buf = self.buffers[set_index]
        dev = buf.dev
        meta = AttentionMetadata(
            slot_mapping=dev["slot_mapping"][:size], num_decode=size,
            decode_block_tables=dev["decode_tables"][:size], decode_context_lens=dev["decode_lens"][:size],
            prefills=[], decode_backend=self.decode_backend, decode_kernel=self.decode_kernel,
        )  # fmt: skip
        hidden = self.model(self._carried_ids(set_index, size), dev["positions"][:size], self.kv_caches, meta)
        buf.samples_dev[:size].copy_(self.model.greedy_tokens(hidden))

    def _mixed_graph_step(self, set_index: int, tokens: int) -> None:
        """The captured body of a mixed step padded to `tokens` (see mixed_graphs.py); all greedy."""
        buf = self.buffers[set_index]
        dev = buf.dev
        rows = mixed.graph_rows(tokens, self.max_seqs)
        meta = mixed.metadata(dev, tokens, rows, self.decode_kernel)
        hidden = self.model(
            self._carried_ids(set_index, tokens), dev["positions"][:tokens], self.kv_caches, meta
        )
        buf.samples_dev[:rows].copy_(self.model.greedy_tokens(hidden[dev["sample_rows"][:rows]]))

    def _eager_step(self, set_index: int, layout: StepLayout) -> None:
        buf = self.buffers[set_index]
        dev = buf.dev
        t, nd, s = layout.num_tokens, layout.num_decode, layout.num_samples
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
        input_ids = self._carried_ids(set_index, t) if layout.has_placeholders else dev["input_ids"][:t]
        hidden = self.model(input_ids, dev["positions"][:t], self.kv_caches, meta)
        if layout.all_greedy:  # the same kernel as the graphs' steps, so every step picks alike
            buf.samples_dev[:s].copy_(self.model.greedy_tokens(hidden[dev["sample_rows"][:s]]))
            return
        logits = self.model.compute_logits(hidden[dev["sample_rows"][:s]])
        params = SamplingTensors(
            temperature=dev["temperature"][:s], top_k=dev["top_k"][:s], top_p=dev["top_p"][:s],
            seed=dev["seed"][:s], position=dev["out_position"][:s], all_greedy=layout.all_greedy,
            any_top_k=layout.any_top_k, any_top_p=layout.any_top_p,
        )  # fmt: skip
        buf.samples_dev[:s].copy_(sample(logits, params))
