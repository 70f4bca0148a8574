"""Multi-LoRA through the engine on the CPU: greedy output with an adapter equals transformers + PEFT
(the adapter loaded unmerged) token for token in float32, with rows of several adapters and rows of
the base model in the same steps; forks carry the adapter; the prefix cache never shares blocks
across adapters."""

from __future__ import annotations

import asyncio

import pytest

from replica import Engine, EngineConfig, SamplingParams
from tests.replica.checkpoints import (
    first_divergence,
    hf_from_dir,
    hf_greedy_many,
    random_hf_model,
    save_checkpoint,
    tiny_config,
)
from tests.replica.lora_checkpoints import ALL_TARGETS, peft_reference, write_adapter

VOCAB = 49152
SUBSET = ("q_proj", "v_proj", "down_proj")
# (name, rank, alpha, targets, rslora): ranks 8 and 16 in one pool, all seven modules and a subset.
ADAPTERS = [
    ("all-r8", 8, 8.0, ALL_TARGETS, False),
    ("sub-r16", 16, 8.0, SUBSET, True),
    ("attn-r4", 4, 6.0, ("q_proj", "k_proj", "o_proj", "up_proj"), False),
]
MAX_TOKENS = 12


async def _one(engine: Engine, prompt, adapter, delay: float, n: int = 1, scope: str = "") -> dict:
    await asyncio.sleep(delay)  # staggered: requests join a running batch over several steps
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, n=n)
    out: dict[int, list[int]] = {}
    async for item in engine.generate(prompt, params, adapter=adapter, cache_scope=scope):
        out.setdefault(item.index, []).extend(item.token_ids)
    return out


def _prompts(mixed_prompts, count: int) -> list[list[int]]:
    return [p[:120] for p in mixed_prompts[:count]]


async def _check_kind(kind_name, tmp_path, smollm2_dir, prompts, adapters, engine_kwargs, seed):
    kind = tiny_config(kind_name, VOCAB)
    model = random_hf_model(kind, seed=seed)
    model_dir = save_checkpoint(model, kind, tmp_path / kind_name, smollm2_dir)
    dirs = {
        name: write_adapter(model, tmp_path / name, targets, rank, alpha, seed + i, rslora)
        for i, (name, rank, alpha, targets, rslora) in enumerate(adapters)
    }
    names = [None, *dirs]
    plan = [(p, names[i % len(names)]) for i, p in enumerate(prompts)]
    base_model = hf_from_dir(model_dir)
    base_outs = hf_greedy_many(base_model, prompts, [MAX_TOKENS] * len(prompts), [])
    base = dict(zip(map(tuple, prompts), base_outs, strict=True))
    references = {None: base}
    for name in dirs:
        mine = [p for p, a in plan if a == name]
        outs = hf_greedy_many(peft_reference(model_dir, dirs[name]), mine, [MAX_TOKENS] * len(mine), [])
        references[name] = dict(zip(map(tuple, mine), outs, strict=True))
        # The adapter changes the answers: the comparison below is not the base model's again.
        assert any(references[name][k] != base[k] for k in references[name]), name
    config = EngineConfig(
        model=str(model_dir), device="cpu", lora_slots=len(dirs), max_lora_rank=16,
        lora_adapters=tuple((n, str(d)) for n, d in dirs.items()), **engine_kwargs,
    )  # fmt: skip
    engine = Engine(config)
    await engine.start()
    try:
        outs = await asyncio.gather(*(_one(engine, p, a, 0.02 * (i % 5)) for i, (p, a) in enumerate(plan)))
        stats = engine.stats()
    finally:
        await engine.stop()
    for i, ((prompt, name), out) in enumerate(zip(plan, outs, strict=True)):
        ref = references[name][tuple(prompt)]
        at = first_divergence(out[0], ref)
        assert out[0] == ref, f"{kind_name}: request {i} (adapter {name}) differs at token {at}"
    assert stats.kv_blocks_used == 0 and stats.running == 0
    return references


async def test_llama_mixed_adapters_equal_peft(tmp_path, smollm2_dir, mixed_prompts):
    """Three adapters (ranks 4, 8 and 16, all seven modules and subsets, rsLoRA) and the base model,
    staggered in one engine: each request equals transformers + PEFT alone."""
    prompts = _prompts(mixed_prompts, 12)
    engine = dict(mode="async", max_num_batched_tokens=128)
    await _check_kind("llama-tied", tmp_path, smollm2_dir, prompts, ADAPTERS, engine, seed=0)


@pytest.mark.parametrize(
    ("kind_name", "engine"),
    [
        ("qwen2", dict(mode="sync", max_num_batched_tokens=128)),  # q/k/v biases, a bf16 checkpoint
        ("qwen3", dict(mode="async", max_num_batched_tokens=64, num_kv_blocks=21)),  # q/k norms; preempts
    ],
)
async def test_qwen_adapters_equal_peft(kind_name, engine, tmp_path, smollm2_dir, mixed_prompts):
    prompts = _prompts(mixed_prompts, 8)
    await _check_kind(kind_name, tmp_path, smollm2_dir, prompts, ADAPTERS[:2], engine, seed=3)


@pytest.fixture(scope="module")
def llama_setup(tmp_path_factory, smollm2_dir):
    """A tiny Llama checkpoint, two adapters of it, and their references' models."""
    root = tmp_path_factory.mktemp("lora")
    kind = tiny_config("llama-tied", VOCAB)
    model = random_hf_model(kind, seed=5)
    model_dir = save_checkpoint(model, kind, root / "model", smollm2_dir)
    dirs = {
        "a": write_adapter(model, root / "a", ALL_TARGETS, 8, 8.0, seed=1),
        "b": write_adapter(model, root / "b", SUBSET, 16, 16.0, seed=2),
    }
    return model, model_dir, dirs


def _refs(model_dir, dirs, prompts) -> dict:
    models = {None: hf_from_dir(model_dir)} | {n: peft_reference(model_dir, d) for n, d in dirs.items()}
    return {n: hf_greedy_many(m, prompts, [MAX_TOKENS] * len(prompts), []) for n, m in models.items()}


async def test_prefix_cache_is_not_shared_across_adapters(llama_setup, mixed_prompts):
    _, model_dir, dirs = llama_setup
    prompt = mixed_prompts[1][:100]  # 6 full blocks of 16 before its last token
    refs = _refs(model_dir, dirs, [prompt])
    config = EngineConfig(
        model=str(model_dir), device="cpu", mode="async", lora_slots=2,
        lora_adapters=tuple((n, str(d)) for n, d in dirs.items()),
    )  # fmt: skip
    engine = Engine(config)
    await engine.start()
    try:
        seen = []
        for adapter in ("a", "a", "b", None, None, "b"):
            params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
            tokens, cached = [], None
            async for out in engine.generate(prompt, params, adapter=adapter, cache_scope="t"):
                tokens.extend(out.token_ids)
                cached = out.num_cached_tokens
            assert tokens == refs[adapter][0], adapter
            seen.append(cached)
    finally:
        await engine.stop()
    # The first request of each adapter (and of the base) finds nothing; a repeat finds its own blocks.
    assert seen == [0, 96, 0, 0, 96, 96]


async def test_forks_carry_the_adapter(llama_setup, mixed_prompts):
    _, model_dir, dirs = llama_setup
    prompts = [mixed_prompts[2][:40], mixed_prompts[3][:70]]
    refs = _refs(model_dir, dirs, prompts)
    config = EngineConfig(
        model=str(model_dir), device="cpu", mode="async", lora_slots=2,
        lora_adapters=tuple((n, str(d)) for n, d in dirs.items()),
    )  # fmt: skip
    engine = Engine(config)
    await engine.start()
    try:
        outs = await asyncio.gather(
            _one(engine, prompts[0], "a", 0.0, n=2), _one(engine, prompts[1], "b", 0.01, n=3)
        )
        resident = engine.resident_adapters()
        slots = engine.core.scheduler.lora
    finally:
        await engine.stop()
    assert outs[0] == {0: refs["a"][0], 1: refs["a"][0]}  # greedy samples: each equals the reference
    assert outs[1] == {i: refs["b"][1] for i in range(3)}
    assert sorted(resident) == ["a", "b"] and slots.users == [0, 0]


async def test_one_slot_two_adapters_wait_and_evict(llama_setup, mixed_prompts):
    """Two adapters through one slot: a request whose adapter is not resident waits until the other
    adapter's requests are done (every slot held), then its adapter replaces the idle one."""
    _, model_dir, dirs = llama_setup
    prompts = [p[:50] for p in mixed_prompts[4:10]]
    refs = _refs(model_dir, dirs, prompts)
    config = EngineConfig(
        model=str(model_dir), device="cpu", mode="async", lora_slots=1,
        lora_adapters=tuple((n, str(d)) for n, d in dirs.items()),
    )  # fmt: skip
    engine = Engine(config)
    await engine.start()
    try:
        names = ["a", "b", None, "a", "b", "b"]
        outs = await asyncio.gather(*(_one(engine, p, n, 0.0) for p, n in zip(prompts, names, strict=True)))
        slots = engine.core.scheduler.lora
    finally:
        await engine.stop()
    for i, (out, name) in enumerate(zip(outs, names, strict=True)):
        assert out[0] == refs[name][i], (i, name)
    assert slots.num_loads >= 2 and slots.num_evictions >= 1 and slots.users == [0]
    assert engine.resident_adapters() in (["a"], ["b"])
