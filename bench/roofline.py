"""The memory roofline of a decode step: the bytes it must read over the measured copy bandwidth."""

from __future__ import annotations

import torch

from replica.model_loader import LoadedModel


def copy_bandwidth_gbps(size_gb: float = 2.0) -> float:
    """Device-to-device copy rate, counting bytes read plus bytes written (the roofline's ceiling)."""
    src = torch.empty(int(size_gb * 2**30), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1000.0 / 10
    del src, dst
    return 2 * size_gb * 2**30 / seconds / 1e9


def roofline(loaded: LoadedModel, args, measured_tok_s: float) -> dict:
    """Bytes a decode step must read (weights + the batch's KV) over copy bandwidth -> max tokens/s."""
    model, cfg = loaded.model, loaded.config
    weights = sum(
        p.numel() * p.element_size() for n, p in model.named_parameters() if n != "embed_tokens.weight"
    )
    if cfg.tie_word_embeddings:
        weights += model.lm_head.weight.numel() * model.lm_head.weight.element_size()
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * model.head_dim * 2  # bf16
    mean_context = args.prompt_len + args.max_tokens / 2
    step_bytes = weights + args.concurrency * mean_context * kv_per_token
    bandwidth = copy_bandwidth_gbps()
    step_s = step_bytes / (bandwidth * 1e9)
    ceiling = args.concurrency / step_s
    return {
        "weight_bytes": weights,
        "kv_bytes_per_step": step_bytes - weights,
        "copy_bandwidth_gbps": bandwidth,
        "roofline_tokens_per_s": ceiling,
        "share_of_roofline": measured_tok_s / ceiling,
    }
