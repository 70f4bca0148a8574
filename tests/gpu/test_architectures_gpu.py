"""Every supported architecture on CUDA, through every GPU path (skipped without CUDA).

float32: tiny checkpoints written by transformers (tests/replica/checkpoints.py) through the fused
Triton kernels, the paged decode kernel with the rotary embedding inside, decode CUDA graphs, and
the unfused eager path; each answer equals transformers' `generate` on the GPU, or parts from it
only at a near-tie (checked by teacher forcing in transformers' float32: the engine's token is
within 1e-3 of its best logit at every step). bf16: a 4-layer directory of the Llama-3.2-1B widths
written by bench/write_checkpoint.py, through flash varlen prefill, mixed-step graphs, K-slice
partials and the Triton output-projection GEMM; bf16 rounding flips near-ties, so most answers must
equal transformers' bf16 `generate` over their first 16 tokens, and every token the engine picks
must be within 1.0 of transformers' best float32 logit (a wrong bias, norm or rope misses by far
more: the logits spread with a standard deviation near 9).

Run on the GPU machine: python -m pytest tests/gpu -q --confcutdir=tests/gpu
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from replica import Engine, EngineConfig, SamplingParams
from tests.replica.checkpoints import (
    KINDS,
    first_divergence,
    hf_from_dir,
    hf_greedy_many,
    logit_gaps,
    random_hf_model,
    save_checkpoint,
    tiny_config,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

VOCAB = 8192
MAX_TOKENS = [24, 8, 40, 16, 32, 12, 48, 20, 8, 36, 16, 28]
PATHS = {
    "graphs": {},  # fused kernels, rope inside the decode kernel, decode graphs
    "split-rope-kernel": {"decode_attention_rope": False, "decode_attention_splits": 3},
    "eager-unfused": {"cuda_graphs": False, "fused_kernels": False},
}


def _prompts(count: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab - 1, size=int(n)).tolist() for n in rng.integers(8, 300, size=count)]


async def _generate(config: EngineConfig, prompts, max_tokens: list[int]):
    """Staggered arrivals: requests join running batches, so steps mix decodes and new prompts."""
    engine = Engine(config)
    await engine.start()
    try:

        async def one(i: int) -> list[int]:
            await asyncio.sleep(0.003 * (i % 5))
            params = SamplingParams(max_tokens=max_tokens[i], temperature=0.0, ignore_eos=True)
            return [t async for out in engine.generate(prompts[i], params) for t in out.token_ids]

        outputs = await asyncio.gather(*(one(i) for i in range(len(prompts))))
        runner = engine.core.runner
        return outputs, runner.graph_replays, runner.mixed_replays
    finally:
        await engine.stop()


def _tiny_checkpoint(name: str, out: Path) -> Path:
    """GPU-sized tiny kinds: head_dim 32 (64 for Qwen3), at least the kernels' 16."""
    from bench.write_checkpoint import checkpoint_tokenizer

    kind = tiny_config(name, VOCAB, hidden=128, heads=4, kv_heads=2)
    return save_checkpoint(
        random_hf_model(kind, seed=KINDS.index(name)), kind, out, checkpoint_tokenizer(VOCAB)
    )


@pytest.mark.parametrize("name", KINDS)
def test_float32_equals_transformers_on_every_path(name, tmp_path):
    model_dir = _tiny_checkpoint(name, tmp_path / name)
    prompts = _prompts(len(MAX_TOKENS), VOCAB, seed=KINDS.index(name))
    hf = hf_from_dir(model_dir).to("cuda")
    references = hf_greedy_many(hf, prompts, MAX_TOKENS, [])
    for path, knobs in PATHS.items():
        config = EngineConfig(model=str(model_dir), device="cuda", dtype="float32", max_num_seqs=16, **knobs)
        outputs, graphed, _ = asyncio.run(_generate(config, prompts, MAX_TOKENS))
        assert (graphed > 0) == config.cuda_graphs, f"{name}/{path}: decode graphs ran {graphed} times"
        for i, (ours, ref) in enumerate(zip(outputs, references, strict=True)):
            assert len(ours) == MAX_TOKENS[i]
            if ours == ref:
                continue
            gaps = logit_gaps(hf, prompts[i], ours)
            at = first_divergence(ours, ref)
            assert max(gaps) < 1e-3, (
                f"{name}/{path}: request {i} parts from transformers at token {at}, and its tokens "
                f"miss transformers' best logit by up to {max(gaps):.3g} (gaps {[round(g, 4) for g in gaps]})"
            )


BF16_ARCHS = {"llama": None, "qwen2": None, "qwen3": 128, "mistral": None}  # arch -> head_dim


@pytest.mark.parametrize("arch", sorted(BF16_ARCHS))
def test_bf16_agrees_with_transformers_on_a_written_directory(arch, tmp_path):
    from bench.write_checkpoint import write_checkpoint

    model_dir = write_checkpoint(
        "llama-3.2-1b", tmp_path / arch, torch.bfloat16, arch, "1GB", layers=4, head_dim=BF16_ARCHS[arch],
        device="cuda",
    )  # fmt: skip
    prompts = _prompts(12, 49000, seed=21)
    max_tokens = [32] * len(prompts)
    config = EngineConfig(
        model=str(model_dir), device="cuda", max_num_seqs=16, max_num_batched_tokens=256, num_kv_blocks=2048
    )
    outputs, graphed, mixed = asyncio.run(_generate(config, prompts, max_tokens))
    assert graphed > 0 and mixed > 0, (graphed, mixed)
    hf = hf_from_dir(model_dir).to("cuda")  # float32: the judge of every token the engine picked
    gaps = [max(logit_gaps(hf, p, o)) for p, o in zip(prompts, outputs, strict=True)]
    hf16 = hf.to(torch.bfloat16)
    references = hf_greedy_many(hf16, prompts, max_tokens, [])
    divergence = [first_divergence(o, r) for o, r in zip(outputs, references, strict=True)]
    report = (
        f"{arch}: first divergence per request {divergence}; worst logit gaps {[round(g, 3) for g in gaps]}"
    )
    assert max(gaps) < 1.0, report
    assert sum(d >= 16 for d in divergence) >= len(prompts) // 2, report
