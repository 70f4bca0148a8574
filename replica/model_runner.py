"""Runs one planned step on the device: copy inputs in, forward, sample, copy tokens out.

`launch` only enqueues work (on CUDA) and returns a handle; `wait` blocks on that step's D2H event
and returns the sampled ids. The engine launches step N+1 before it waits for step N, so host and
device overlap. Tokens that step N samples reach step N+1 on the device: a placeholder input row
names its source row in N's samples and is filled in by a gather before the forward.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from replica.attention import AttentionMetadata, PrefillChunk
from replica.llama import LlamaForCausalLM
from replica.sampler import SamplingTensors, sample
from replica.scheduler import StepPlan
from replica.step_inputs import StepInputs, build_step_inputs
from replica.streams import StepStreams


@dataclass
class StepHandle:
    plan: StepPlan
    samples_host: torch.Tensor
    prepare_ms: float
    events: dict  # name -> event: start, h2d_done, compute_done, d2h_done

    def timings_ms(self) -> dict[str, float]:
        ev = self.events
        return {
            "prepare_ms": self.prepare_ms,
            "h2d_ms": ev["start"].elapsed_time(ev["h2d_done"]),
            "compute_ms": ev["h2d_done"].elapsed_time(ev["compute_done"]),
            "d2h_ms": ev["compute_done"].elapsed_time(ev["d2h_done"]),
        }


class ModelRunner:
    def __init__(
        self, model: LlamaForCausalLM, device: torch.device, num_blocks: int, block_size: int
    ) -> None:
        cfg = model.config
        self.model = model
        self.device = device
        self.block_size = block_size
        self.streams = StepStreams(device)
        dtype = next(model.parameters()).dtype
        shape = (num_blocks, block_size, cfg.num_key_value_heads, model.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.num_hidden_layers)
        ]
        self._prev_samples: torch.Tensor | None = None

    @staticmethod
    def kv_bytes_per_block(model: LlamaForCausalLM, block_size: int, dtype: torch.dtype) -> int:
        cfg = model.config
        per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * model.head_dim
        return per_token * block_size * torch.finfo(dtype).bits // 8

    def reset_carry(self) -> None:
        """Forget the last step's samples (after a failed step nothing may read them)."""
        self._prev_samples = None

    @torch.inference_mode()
    def launch(self, plan: StepPlan) -> StepHandle:
        t0 = time.perf_counter()
        host = build_step_inputs(plan, self.block_size)
        prepare_ms = (time.perf_counter() - t0) * 1000.0
        events = {name: self.streams.event() for name in ("start", "h2d_done", "compute_done", "d2h_done")}
        with self.streams.on("h2d"):
            events["start"].record()
            dev = self._to_device(host)
            events["h2d_done"].record()
        self.streams.wait("compute", events["h2d_done"])
        with self.streams.on("compute"):
            samples = self._forward_and_sample(host, dev)
            events["compute_done"].record()
        self.streams.wait("d2h", events["compute_done"])
        with self.streams.on("d2h"):
            samples_host = samples.to("cpu", non_blocking=self.streams.is_cuda)
            events["d2h_done"].record()
        self._prev_samples = samples
        return StepHandle(plan, samples_host, prepare_ms, events)

    def wait(self, handle: StepHandle) -> np.ndarray:
        """Block until the step's tokens are on the host; the engine's only planned wait."""
        handle.events["d2h_done"].synchronize()
        return handle.samples_host.numpy()

    def _to_device(self, host: StepInputs) -> dict[str, torch.Tensor]:
        names = (
            "input_ids",
            "prev_rows",
            "positions",
            "slot_mapping",
            "decode_block_tables",
            "decode_context_lens",
            "sample_rows",
            "temperature",
            "top_k",
            "top_p",
            "seed",
            "out_position",
        )
        blocking = not self.streams.is_cuda
        out = {
            n: torch.from_numpy(getattr(host, n)).to(self.device, non_blocking=not blocking) for n in names
        }
        out["prefill_tables"] = [
            torch.from_numpy(p[3]).to(self.device, non_blocking=not blocking) for p in host.prefills
        ]
        return out

    def _forward_and_sample(self, host: StepInputs, dev: dict) -> torch.Tensor:
        input_ids = dev["input_ids"]
        if host.has_placeholders:
            if self._prev_samples is None:
                raise RuntimeError("a placeholder token has no previous step to come from")
            carried = self._prev_samples[dev["prev_rows"].clamp(min=0)]
            input_ids = torch.where(dev["prev_rows"] >= 0, carried, input_ids)
        meta = AttentionMetadata(
            slot_mapping=dev["slot_mapping"],
            num_decode=len(host.decode_context_lens),
            decode_block_tables=dev["decode_block_tables"],
            decode_context_lens=dev["decode_context_lens"],
            prefills=[
                PrefillChunk(q_start, q_len, ctx, table)
                for (q_start, q_len, ctx, _), table in zip(host.prefills, dev["prefill_tables"], strict=True)
            ],
        )
        hidden = self.model(input_ids, dev["positions"], self.kv_caches, meta)
        logits = self.model.compute_logits(hidden[dev["sample_rows"]])
        params = SamplingTensors(
            temperature=dev["temperature"],
            top_k=dev["top_k"],
            top_p=dev["top_p"],
            seed=dev["seed"],
            position=dev["out_position"],
            all_greedy=bool((host.temperature == 0).all()),
            any_top_k=bool((host.top_k > 0).any()),
            any_top_p=bool((host.top_p < 1).any()),
        )
        return sample(logits, params)
