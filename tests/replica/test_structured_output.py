"""Structured output on the real SmolLM2 (CPU): answers under a JSON schema parse and validate,
sampled ones too (n > 1: a matcher per sample), json_object gives an object, the grammar's end stops
a sequence, unconstrained neighbours are unaffected, and bad schemas are refused."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from replica import Engine, EngineConfig, InvalidRequestError, SamplingParams
from replica.grammar_spec import json_object, json_schema
from tests.replica.conftest import collect

pytest.importorskip("llguidance")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "languages"],
    "additionalProperties": False,
}
SMALL = {
    "type": "object",
    "properties": {
        "word": {"type": "string", "maxLength": 10},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["word", "n", "ok"],
    "additionalProperties": False,
}


def _chat(engine: Engine, text: str) -> list[int]:
    return engine.apply_chat_template([{"role": "user", "content": text}])


def _texts(outputs: list) -> dict[int, str]:
    by_index: dict[int, str] = {}
    for out in outputs:
        by_index[out.index] = by_index.get(out.index, "") + out.text
    return by_index


async def _outputs(engine: Engine, prompt, params: SamplingParams) -> list:
    return [out async for out in engine.generate(prompt, params)]


async def test_a_schema_constrained_answer_parses_and_validates(engine):
    prompt = _chat(engine, "Describe a person as JSON: name, age, city and languages.")
    params = SamplingParams(max_tokens=120, temperature=0.0, grammar=json_schema(PERSON))
    tokens, text, last = await collect(engine, prompt, params)
    assert last.finish_reason == "stop", text
    jsonschema.validate(json.loads(text), PERSON)
    assert tokens[-1] in engine.eos_token_ids  # the grammar's end is an EOS, allowed only then
    # The profiler names the split steps: one masked row here, and in async mode the masks of a
    # decode step waited inside its launch for the token the step before drew.
    split = [r for r in engine.core.profiler.records if r.masked_rows]
    assert split and {r.masked_rows for r in split} == {1}
    assert any(r.read_early for r in split)
    assert not any(r.read_early for r in engine.core.profiler.records if not r.masked_rows)


async def test_fifty_sampled_answers_all_parse_and_validate(engine):
    """Temperature 1, ten requests of five samples each: every sample has its own matcher."""
    prompt = _chat(engine, "Reply with a JSON object with a word, a number and a flag.")
    spec = json_schema(SMALL)
    requests = [
        _outputs(engine, prompt, SamplingParams(max_tokens=80, temperature=1.0, n=5, seed=i, grammar=spec))
        for i in range(10)
    ]
    answers = []
    for outputs in await asyncio.gather(*requests):
        ends = {out.index: out.finish_reason for out in outputs if out.finished}
        assert ends == dict.fromkeys(range(5), "stop"), ends
        answers.extend(_texts(outputs).values())
    assert len(answers) == 50
    for text in answers:
        jsonschema.validate(json.loads(text), SMALL)
    assert len(set(answers)) > 5, "sampled answers should differ"


async def test_json_object_gives_an_object(engine):
    prompt = _chat(engine, "Give me a JSON object with two keys, city and temperature, for Paris today.")
    params = SamplingParams(max_tokens=200, temperature=0.0, grammar=json_object())
    _, text, last = await collect(engine, prompt, params)
    assert last.finish_reason == "stop", text
    assert isinstance(json.loads(text), dict)


async def test_unconstrained_neighbours_are_unaffected(engine):
    """Greedy answers beside constrained requests (greedy and sampled) equal the same answers alone."""
    prompts = [_chat(engine, q) for q in ("Name three rivers.", "What is a prime number?")]
    plain = SamplingParams(max_tokens=24, temperature=0.0)
    alone = [(await collect(engine, p, plain))[0] for p in prompts]
    constrained = [
        collect(
            engine, prompts[0], SamplingParams(max_tokens=60, temperature=0.0, grammar=json_schema(SMALL))
        ),
        collect(
            engine, prompts[1], SamplingParams(max_tokens=60, temperature=1.0, seed=5, grammar=json_object())
        ),
    ]
    results = await asyncio.gather(*(collect(engine, p, plain) for p in prompts), *constrained)
    assert [r[0] for r in results[:2]] == alone


async def test_the_grammar_end_stops_even_under_ignore_eos(engine):
    prompt = _chat(engine, "Reply with a JSON object with a word, a number and a flag.")
    params = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True, grammar=json_schema(SMALL))
    _, text, last = await collect(engine, prompt, params)
    assert last.finish_reason == "stop"
    jsonschema.validate(json.loads(text), SMALL)


async def test_sync_and_async_modes_give_the_same_constrained_answers(engine):
    """Async mode reads step N back just before it fills step N+1's masks; sync mode never overlaps."""
    sync = Engine(EngineConfig(model="smollm2-135m", device="cpu", mode="sync", max_num_batched_tokens=256))
    await sync.start()
    try:
        prompt = _chat(engine, "Describe a person as JSON: name, age, city and languages.")
        params = SamplingParams(max_tokens=80, temperature=0.8, seed=11, n=2, grammar=json_schema(PERSON))
        got = [_texts(await _outputs(e, prompt, params)) for e in (engine, sync)]
        assert got[0] == got[1]
    finally:
        await sync.stop()


async def test_a_schema_compiles_once(engine):
    boolean = {"type": "boolean"}
    spec = json_schema(
        {"type": "object", "properties": {"x": boolean}, "required": ["x"], "additionalProperties": False}
    )
    prompt = _chat(engine, "JSON with x.")
    await collect(engine, prompt, SamplingParams(max_tokens=20, temperature=0.0, grammar=spec))
    compiles = engine.grammars.compiles
    respaced = json.loads(spec.schema)  # the same schema as a new object: the same cache entry
    params = SamplingParams(
        max_tokens=20, temperature=0.0, grammar={"kind": "json_schema", "schema": respaced}
    )
    _, text, _ = await collect(engine, prompt, params)
    assert engine.grammars.compiles == compiles
    assert json.loads(text) in ({"x": True}, {"x": False})


@pytest.mark.parametrize(
    "schema",
    [{"type": "objekt"}, {"$ref": "#/$defs/missing"}, {"type": "string", "pattern": "[a-"}],
)
async def test_a_schema_the_grammar_cannot_compile_is_an_invalid_request(engine, schema):
    prompt = _chat(engine, "Anything.")
    with pytest.raises(InvalidRequestError, match="response_format"):
        await collect(engine, prompt, SamplingParams(max_tokens=8, grammar=json_schema(schema)))
    _, _, last = await collect(engine, prompt, SamplingParams(max_tokens=4, temperature=0.0))
    assert last.finished  # the engine serves on


def test_min_tokens_with_a_grammar_is_refused():
    with pytest.raises(InvalidRequestError, match="min_tokens"):
        SamplingParams(max_tokens=8, min_tokens=2, grammar=json_object())


async def test_the_tokenizer_view_is_built_once_ahead_of_any_grammar(engine, monkeypatch):
    """`prepare` builds the grammar library's view of the tokenizer (a second of held interpreter
    lock at 128k ids) before any request; the first grammar then only compiles."""
    import llguidance.hf

    from replica.grammar_compiler import GrammarCompiler

    built = []
    real = llguidance.hf.from_tokenizer
    monkeypatch.setattr(llguidance.hf, "from_tokenizer", lambda *a, **k: built.append(1) or real(*a, **k))
    compiler = GrammarCompiler(engine.tokenizer, engine.loaded.config.vocab_size, engine.eos_token_ids)
    try:
        compiler.prepare().result(timeout=120)
        assert built == [1] and compiler.compiles == 0
        compiler.compile(json_schema(SMALL)).result(timeout=120)
        assert built == [1] and compiler.compiles == 1
    finally:
        compiler.close()


async def test_prepare_grammars_says_whether_the_engine_can_constrain_output(engine, monkeypatch):
    assert await engine.prepare_grammars()
    monkeypatch.setattr(engine.loaded, "tokenizer", None)
    assert not await engine.prepare_grammars()
