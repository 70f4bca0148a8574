"""The transformers baselines of the engine benchmark (`bench/engine_lockstep.py`): `generate` on the whole
batch or one request at a time, and transformers' own continuous batching (`generate_batch`) in a
child process with its own time limit. They run on the weights the engine ran (same preset, seed).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from replica.model_loader import LoadedModel


def run_hf(args, loaded: LoadedModel, prompts: list[list[int]], batched: bool) -> dict:
    from bench.hf_reference import hf_model_like

    model = hf_model_like(loaded)
    if not batched:
        prompts = prompts[: args.hf_requests]
    groups = [prompts] if batched else [[p] for p in prompts]
    hf_generate(model, [prompts[0]], 4)  # warm-up
    start = time.perf_counter()
    outputs = [row for group in groups for row in hf_generate(model, group, args.max_tokens)]
    wall = time.perf_counter() - start
    total = sum(len(o) for o in outputs)
    return {
        "mode": "hf" if batched else "hf-single",
        "requests": len(outputs),
        "output_tokens": total,
        "wall_s": wall,
        "output_tokens_per_s": total / wall,
        "tpot_ms_p50": wall / args.max_tokens * 1000.0 / (1 if batched else len(outputs)),
        "outputs": outputs,
    }


def hf_generate(model, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    device = next(model.parameters()).device
    ids = torch.tensor(prompts, device=device)
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out[:, ids.shape[1] :].tolist()


def run_hf_cb(args, loaded: LoadedModel, prompts: list[list[int]]) -> dict:
    """transformers' own continuous batching (`generate_batch`), async batching on where it exists."""
    from transformers import GenerationConfig

    from bench.hf_reference import hf_model_like

    model = hf_model_like(loaded)
    generation = GenerationConfig(
        max_new_tokens=args.max_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    batching = _cb_config(args)
    model.generate_batch(
        prompts[:2], generation_config=generation, continuous_batching_config=batching
    )  # warm-up
    start = time.perf_counter()
    outputs = model.generate_batch(prompts, generation_config=generation, continuous_batching_config=batching)
    wall = time.perf_counter() - start
    total = sum(len(o.generated_tokens) for o in outputs.values())
    return {"mode": "hf-cb", "output_tokens": total, "wall_s": wall, "output_tokens_per_s": total / wall}


def _cb_config(args):
    """Async batching on, and the paged cache sized for this run's requests (the default sizing takes
    a share of free memory and ran out of memory on an empty H200). Only fields this release has."""
    import inspect

    from transformers import ContinuousBatchingConfig

    default = ContinuousBatchingConfig()
    page = getattr(default, "page_size", None) or getattr(default, "block_size", None) or 256
    tokens = args.concurrency * (args.prompt_len + args.max_tokens)
    wanted = {
        "use_async_batching": True,
        "num_blocks": -(-tokens // page) + args.concurrency,
        "max_batch_tokens": args.max_batched_tokens,
        "max_requests_per_batch": args.concurrency,
    }
    accepted = inspect.signature(ContinuousBatchingConfig).parameters
    return ContinuousBatchingConfig(**{k: v for k, v in wanted.items() if k in accepted})


def hf_cb_in_child(args) -> dict:
    """Run the hf-cb mode in a child process bounded by --hf-cb-timeout; its JSON comes back in a file."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "hf_cb.json"
        argv = [
            sys.executable,
            "-m",
            "bench.engine_lockstep",
            "--modes",
            "hf-cb",
            "--in-child",
            "--json",
            str(out),
        ]
        for name in ("model", "device", "prompt_len", "max_tokens", "max_batched_tokens"):
            argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
        argv += ["--batch", str(args.concurrency)] + (["--random-weights"] if args.random_weights else [])
        try:
            limit = args.hf_cb_timeout
            done = subprocess.run(argv, timeout=limit, check=False, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            return {"mode": "hf-cb", "error": f"did not finish within {limit} s (warm-up included)"}
        if not out.exists():
            tail = done.stderr.strip().splitlines()[-3:]
            return {"mode": "hf-cb", "error": f"the child process wrote no result: {' | '.join(tail)}"}
        return json.loads(out.read_text())["results"]["hf-cb"]


def load_only(args) -> LoadedModel:
    from replica.device_choice import pick_device, pick_dtype
    from replica.model_loader import load_model

    device = pick_device(args.device)
    return load_model(args.model, device, pick_dtype("auto", device), args.random_weights)
