"""Structured output on the GPU (skipped without CUDA): the token-mask kernel equals the torch path,
constrained requests replay the split graphs (forward, then draw; fixed-size mask buffer,
unconstrained rows idle) and their answers parse and validate, graphed equals eager and sync,
unconstrained neighbours keep their tokens, and constrained steps never sync with the host.

Random weights write nonsense, but the grammar forces valid JSON anyway; the schema's strings are
bounded so every answer ends. The tokenizer is bench/bpe_vocab.py's byte-level BPE at the model's
vocabulary size (trained on first use, cached under ~/.cache/fairlane/bench).

Run on the GPU machine: python -m pytest tests/gpu/test_structured_output_gpu.py -q --confcutdir=tests/gpu
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import numpy as np
import pytest
import torch

from replica import Engine, EngineConfig, SamplingParams
from replica.grammar_masks import apply_token_masks
from replica.grammar_spec import json_object, json_schema

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
pytest.importorskip("llguidance")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "count": {"type": "integer", "minimum": 0, "maximum": 999},
        "kind": {"enum": ["a", "b", "c"]},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
    },
    "required": ["name", "count", "kind", "ok", "tags"],
    "additionalProperties": False,
}
BASE = dict(model="smollm2-135m", random_weights=True, device="cuda", max_num_seqs=32, dtype="float32")


def test_token_mask_kernel_equals_the_torch_path():
    g = torch.Generator().manual_seed(2)
    rows, vocab = 40, 49152
    words = vocab // 32
    logits = torch.randn(rows, vocab, generator=g)
    masks = torch.randint(-(2**31), 2**31 - 1, (rows, words), generator=g, dtype=torch.int64).to(torch.int32)
    mask_rows = torch.where(torch.rand(rows, generator=g) < 0.5, torch.arange(rows), -1).to(torch.int32)
    want = logits.clone()
    apply_token_masks(want, mask_rows, masks)
    got = logits.cuda()
    apply_token_masks(got, mask_rows.cuda(), masks.cuda())
    assert torch.equal(got.cpu(), want)


def _prompts(count: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(100, 40000, size=int(rng.integers(8, 200))).tolist() for _ in range(count)]


def _params(i: int) -> SamplingParams:
    """Constrained rows of every kind (greedy, tempered, filtered, n > 1, json_object) and plain ones."""
    spec = json_schema(SCHEMA)
    kinds = [
        dict(temperature=0.0, grammar=spec),
        dict(temperature=1.0, grammar=spec),
        dict(temperature=0.8, top_p=0.9, n=2, grammar=spec),
        dict(temperature=0.0, ignore_eos=True),
        dict(temperature=0.9, top_k=50, ignore_eos=True),
        dict(temperature=0.7, grammar=json_object(), max_tokens=48),
    ]
    fields = {"max_tokens": 400, "seed": 500 + i, **kinds[i % len(kinds)]}
    return SamplingParams(**fields)


async def _run(config: EngineConfig, prompts, params, sync_debug: bool = False):
    from bench.bpe_vocab import attach

    engine = Engine(config)
    await engine.start()
    attach(engine)
    try:
        warm = SamplingParams(max_tokens=8, temperature=0.9, seed=1, grammar=json_schema(SCHEMA))
        [o async for o in engine.generate(prompts[0], warm)]  # the grammar compiles once, here
        if sync_debug:
            torch.cuda.set_sync_debug_mode("error")

        async def one(i: int):
            outs = [o async for o in engine.generate(prompts[i], params[i])]
            tokens = [(o.index, t) for o in outs for t in o.token_ids]
            texts: dict[int, str] = {}
            for o in outs:
                texts[o.index] = texts.get(o.index, "") + o.text
            return tokens, texts, {o.index: o.finish_reason for o in outs if o.finished}

        engine.hold()
        tasks = [asyncio.create_task(one(i)) for i in range(len(prompts))]
        while engine.open_streams < len(prompts):
            await asyncio.sleep(0)
        engine.release()
        results = await asyncio.gather(*tasks)
        runner = engine.core.runner
        replays = {k: g.replays for k, g in runner.graphs.items()}
        # Constrained steps run as a forward graph, then (masks filled meanwhile) a draw graph.
        replays["split_forward"] = runner.split.forward_replays + runner.split.mixed_replays
        replays["split_draw"] = sum(g.replays for g in runner.split.draw_graphs.values())
        return results, replays, engine.stats()
    finally:
        if sync_debug:
            torch.cuda.set_sync_debug_mode(0)
        await engine.stop()


def _check_answers(results, params) -> None:
    for (_, texts, ends), p in zip(results, params, strict=True):
        if p.grammar is None:
            continue
        for index, text in texts.items():
            if ends[index] != "stop":  # json_object's short budget may cut an answer: it is a prefix then
                assert p.grammar.kind == "json_object" and ends[index] == "length", (ends, text)
                continue
            value = json.loads(text)
            if p.grammar.kind == "json_schema":
                jsonschema.validate(value, SCHEMA)
            else:
                assert isinstance(value, dict)


def test_constrained_requests_replay_graphs_and_match_eager_and_sync():
    prompts = _prompts(18, seed=3)
    params = [_params(i) for i in range(18)]
    runs = {
        "async": EngineConfig(**BASE, mode="async"),
        "sync": EngineConfig(**BASE, mode="sync"),
        "eager": EngineConfig(**BASE, mode="async", cuda_graphs=False),
    }
    results = {name: asyncio.run(_run(cfg, prompts, params)) for name, cfg in runs.items()}
    _check_answers(results["async"][0], params)
    for name in ("async", "eager"):
        differ = [
            i
            for i, (a, b) in enumerate(zip(results[name][0], results["sync"][0], strict=True))
            if a[0] != b[0]
        ]
        assert not differ, f"{name} differs from sync at requests {differ}"
    assert results["async"][1]["split_draw"] > 0, results["async"][1]
    assert results["async"][1]["split_forward"] > 0, results["async"][1]
    assert all(r[2].kv_blocks_used == 0 for r in results.values())


def test_unconstrained_neighbours_keep_their_tokens():
    prompts = _prompts(12, seed=5)
    params = [_params(i) for i in range(12)]
    cfg = EngineConfig(**BASE)
    crowd, _, _ = asyncio.run(_run(cfg, prompts, params))
    plain = [i for i, p in enumerate(params) if p.grammar is None]
    alone, _, _ = asyncio.run(_run(cfg, [prompts[i] for i in plain], [params[i] for i in plain]))
    assert [r[0] for r in alone] == [crowd[i][0] for i in plain]


def test_constrained_steps_never_sync_with_the_host():
    prompts = _prompts(8, seed=7)
    params = [_params(i) for i in range(8)]
    cfg = EngineConfig(**{**BASE, "dtype": "bfloat16", "max_num_seqs": 16})
    results, replays, _ = asyncio.run(_run(cfg, prompts, params, sync_debug=True))
    _check_answers(results, params)
    assert replays["split_draw"] > 0 and replays["split_forward"] > 0, replays
