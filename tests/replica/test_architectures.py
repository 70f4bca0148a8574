"""Every supported architecture, loaded from a directory transformers wrote, equals its `generate`.

For each kind (tests/replica/checkpoints.py) a dozen greedy requests of 8 to 600 prompt tokens
arrive at staggered times, so they join a running batch over many steps with chunked prefill (and
preemption in one run); every one must equal transformers' own greedy output token for token, in
float32, whatever dtype the checkpoint was saved in.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from safetensors import safe_open

from replica import Engine, EngineConfig, PromptTooLongError, SamplingParams
from replica.rope import RotaryEmbedding
from tests.replica.checkpoints import (
    KINDS,
    LLAMA3_ROPE,
    first_divergence,
    hf_from_dir,
    hf_greedy_many,
    random_hf_model,
    save_checkpoint,
    tiny_config,
)

VOCAB = 49152  # the SmolLM2 tokenizer's, saved beside each checkpoint with its chat template
MAX_TOKENS = [24, 8, 40, 16, 32, 12, 48, 20, 8, 36, 16, 28]
# Engine settings per kind: both loop modes, and a cache small enough to force preemption.
ENGINE = {
    "llama-tied": dict(mode="async", max_num_batched_tokens=256),
    "llama3-untied": dict(mode="sync", max_num_batched_tokens=256),
    "llama-bias": dict(mode="async", max_num_batched_tokens=256),
    "qwen2": dict(mode="async", max_num_batched_tokens=128),
    "qwen3": dict(mode="async", max_num_batched_tokens=128, num_kv_blocks=41),
    "mistral": dict(mode="async", max_num_batched_tokens=256),
}
MAX_LEN = {"llama-tied": 4096, "mistral": 1024}  # the rest: the engine's 8192 cap


async def staggered(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    async def one(i: int) -> list[int]:
        await asyncio.sleep(0.02 * (i % 6))  # requests join a running batch over several steps
        params = SamplingParams(max_tokens=MAX_TOKENS[i], temperature=0.0)
        return [t async for out in engine.generate(prompts[i], params) for t in out.token_ids]

    return await asyncio.gather(*(one(i) for i in range(len(prompts))))


def _stop_ids_the_model_reaches(model, prompts: list[list[int]]) -> list[int]:
    """Two tokens that greedy decoding reaches early in two answers (other than the config's eos 2),
    to make them end ids: those answers must then stop there."""
    picked: list[int] = []
    for i in (2, 6):  # requests with room for 40 and 48 tokens
        [tokens] = hf_greedy_many(model, [prompts[i]], [8], [2])
        picked.append(next(t for t in tokens[3:] if t != 2 and t not in picked))
    return picked


@pytest.mark.parametrize("name", KINDS)
async def test_greedy_equals_transformers(name, tmp_path, smollm2_dir, mixed_prompts):
    prompts = mixed_prompts[: len(MAX_TOKENS)]
    kind = tiny_config(name, VOCAB)
    model = random_hf_model(kind, seed=KINDS.index(name))
    generation, eos = None, [2]
    if name == "llama3-untied":  # Llama 3 style: several end ids, only in the generation config
        eos += _stop_ids_the_model_reaches(model, prompts)
        generation = dict(eos_token_id=eos, do_sample=True, temperature=0.6, top_p=0.9, bos_token_id=1)
    model_dir = save_checkpoint(model, kind, tmp_path / name, smollm2_dir, generation)
    references = hf_greedy_many(hf_from_dir(model_dir), prompts, MAX_TOKENS, eos)

    engine = Engine(EngineConfig(model=str(model_dir), device="cpu", **ENGINE[name]))
    await engine.start()
    try:
        outputs = await staggered(engine, prompts)
        stats = engine.stats()
    finally:
        await engine.stop()
    for i, (ours, ref) in enumerate(zip(outputs, references, strict=True)):
        at = first_divergence(ours, ref)
        assert ours == ref, f"{name}: request {i} ({len(prompts[i])} prompt tokens) differs at token {at}"
    assert engine.loaded.architecture == type(kind.config).__name__.replace("Config", "ForCausalLM")
    assert engine.eos_token_ids == tuple(sorted(eos))
    assert engine.max_model_len == MAX_LEN.get(name, 8192)
    assert engine.load_seconds > 0.0
    assert stats.kv_blocks_used == 0 and stats.running == 0 and stats.waiting == 0
    if "num_kv_blocks" in ENGINE[name]:
        assert stats.num_preemptions > 0, "the small cache was meant to force preemption"
    if generation:
        assert engine.generation_defaults.sampling_overrides() == {"temperature": 0.6, "top_p": 0.9}
        ended = [o[-1] for o, m in zip(outputs, MAX_TOKENS, strict=True) if len(o) < m]
        assert set(eos[1:]) & set(ended), "the generation config's own end ids stopped no request"


def test_checkpoint_dtypes_and_shards_are_what_the_kinds_say(tmp_path, smollm2_dir):
    """The kinds above cover bf16 and fp16 files and a sharded checkpoint with an index."""
    seen = {}
    for name in KINDS:
        kind = tiny_config(name, 512, hidden=32, heads=2, kv_heads=1)
        kind = dataclasses.replace(kind, max_shard_size="40KB" if kind.max_shard_size else None)
        model_dir = save_checkpoint(random_hf_model(kind), kind, tmp_path / name, smollm2_dir)
        files = sorted(model_dir.glob("*.safetensors"))
        with safe_open(str(files[0]), framework="pt") as f:
            seen[name] = (f.get_slice(next(iter(f.keys()))).get_dtype(), len(files))
        assert (model_dir / "model.safetensors.index.json").exists() == (len(files) > 1)
    assert seen["qwen2"][0] == "BF16" and seen["mistral"][0] == "F16" and seen["qwen3"][0] == "F32"
    assert seen["llama3-untied"][1] > 1


async def test_mistral_refuses_a_request_past_its_window(tmp_path, smollm2_dir):
    kind = tiny_config("mistral", 512, hidden=32, heads=2, kv_heads=1)
    model_dir = save_checkpoint(random_hf_model(kind), kind, tmp_path / "mistral", smollm2_dir)
    engine = Engine(EngineConfig(model=str(model_dir), device="cpu", max_model_len=2048))
    await engine.start()
    try:
        assert engine.max_model_len == 1024  # the window, below both max_model_len and 4096 positions
        prompt = [3 + i % 500 for i in range(1000)]
        with pytest.raises(PromptTooLongError, match="1024"):
            [o async for o in engine.generate(prompt, SamplingParams(max_tokens=30))]
        fits = [o async for o in engine.generate(prompt, SamplingParams(max_tokens=24, ignore_eos=True))]
        assert sum(len(o.token_ids) for o in fits) == 24
    finally:
        await engine.stop()


ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": LLAMA3_ROPE,
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 1000000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 4096,
    },
}


@pytest.mark.parametrize("rope", sorted(ROPES))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rope_tables_equal_transformers(rope, head_dim):
    """Our cos/sin table against transformers' rotary module, at every position up to 32k: Llama 3.x
    scaling bends the low frequencies only, which short test sequences barely reach."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(
        hidden_size=8 * head_dim, num_attention_heads=8, head_dim=head_dim, max_position_embeddings=32768,
        rope_parameters=dict(ROPES[rope]),
    )  # fmt: skip
    ours = RotaryEmbedding(cfg, head_dim).table(torch.device("cpu"))
    positions = torch.arange(cfg.max_position_embeddings)[None, :]
    cos, sin = LlamaRotaryEmbedding(cfg)(torch.zeros(1, dtype=torch.float32), positions)
    torch.testing.assert_close(ours[:, 0], cos[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(ours[:, 1], sin[0], rtol=0, atol=1e-6)


def test_arch_spec_reads_each_family_setting():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    from replica.architectures import arch_spec

    sizes = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3)
    qwen2 = arch_spec(Qwen2Config(**sizes, max_position_embeddings=32768))
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.max_positions == 32768
    windowed = Qwen2Config(**sizes, use_sliding_window=True, sliding_window=2048, max_window_layers=1)
    assert arch_spec(windowed).max_positions == 2048  # layers 1 and 2 slide
    unused = Qwen2Config(**sizes, use_sliding_window=True, sliding_window=2048, max_window_layers=28)
    assert arch_spec(unused).sliding_window is None  # no layer slides
    qwen3 = arch_spec(Qwen3Config(**sizes, head_dim=128, attention_bias=True))
    assert qwen3.qk_norm and qwen3.head_dim == 128 and qwen3.qkv_bias and qwen3.o_bias
    mistral = arch_spec(MistralConfig(**sizes, sliding_window=None, max_position_embeddings=32768))
    assert mistral.max_positions == 32768 and not mistral.uses_bias and mistral.head_dim == 16
    llama = arch_spec(LlamaConfig(**sizes, mlp_bias=True))
    assert llama.mlp_bias and not llama.qkv_bias and not llama.qk_norm
