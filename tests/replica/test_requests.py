"""Request lifecycle: stops, lengths, aborts, bad input, and a failing step that spares the rest."""

from __future__ import annotations

import asyncio

import pytest

from replica import (
    DuplicateRequestError,
    Engine,
    EngineConfig,
    InvalidRequestError,
    PromptTooLongError,
    RequestFailedError,
    SamplingParams,
    UnknownModelError,
)
from tests.replica.conftest import collect, wait_until

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


async def test_chat_answer_and_eos_stop(engine):
    tokens, text, last = await collect(
        engine, engine.apply_chat_template(QUESTION), SamplingParams(max_tokens=32, temperature=0)
    )
    assert text == "The capital of France is Paris."
    assert last.finish_reason == "stop"
    assert tokens[-1] == engine.tokenizer.eos_token_id
    assert last.num_output_tokens == len(tokens)
    m = last.metrics
    assert m.arrival <= m.first_scheduled <= m.first_token <= m.finished


async def test_max_tokens_gives_length(engine):
    tokens, _, last = await collect(
        engine, "Once upon a time", SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    )
    assert len(tokens) == 5 and last.finish_reason == "length"


async def test_stop_string_cuts_the_text(engine):
    prompt = engine.apply_chat_template(QUESTION)
    _, text, last = await collect(
        engine, prompt, SamplingParams(max_tokens=32, temperature=0, stop=["Paris"])
    )
    assert text == "The capital of France is "
    assert last.finish_reason == "stop"
    _, text, _ = await collect(
        engine,
        prompt,
        SamplingParams(max_tokens=32, temperature=0, stop=["Paris"], include_stop_str_in_output=True),
    )
    assert text == "The capital of France is Paris"


async def test_stop_token_id(engine):
    prompt = engine.apply_chat_template(QUESTION)
    full, _, _ = await collect(engine, prompt, SamplingParams(max_tokens=32, temperature=0))
    tokens, _, last = await collect(
        engine, prompt, SamplingParams(max_tokens=32, temperature=0, stop_token_ids=[full[2]])
    )
    assert tokens == full[:3] and last.finish_reason == "stop"


async def test_breaking_out_frees_blocks(engine):
    base = engine.stats().kv_blocks_used
    seen = 0
    async for out in engine.generate(
        "Tell me a long story about a dragon.", SamplingParams(max_tokens=200, temperature=0)
    ):
        seen += len(out.token_ids)
        if seen >= 3:
            break
    await wait_until(lambda: engine.stats().kv_blocks_used == base and engine.stats().running == 0)


async def test_abort_ends_stream_with_abort(engine):
    async def consume():
        return await collect(
            engine,
            "Count from one to one hundred:",
            SamplingParams(max_tokens=300, temperature=0),
            "to-abort",
        )

    task = asyncio.create_task(consume())
    await wait_until(lambda: engine.stats().running == 1)
    await engine.abort("to-abort")
    _, _, last = await asyncio.wait_for(task, 10)
    assert last.finish_reason == "abort"
    await wait_until(lambda: engine.stats().kv_blocks_used == 0)


async def test_bad_input_raises_clear_errors(engine):
    with pytest.raises(InvalidRequestError, match="empty"):
        await anext(engine.generate([], SamplingParams()))
    with pytest.raises(InvalidRequestError, match="out of range"):
        await anext(engine.generate([1, 10**9], SamplingParams()))
    with pytest.raises(PromptTooLongError, match="maximum context length"):
        await anext(engine.generate([1] * engine.max_model_len, SamplingParams(max_tokens=1)))
    gen = engine.generate("hello", SamplingParams(max_tokens=50), request_id="dup")
    await anext(gen)
    with pytest.raises(DuplicateRequestError):
        await anext(engine.generate("hello", SamplingParams(), request_id="dup"))
    await gen.aclose()
    # The loop still serves after all of that.
    _, text, _ = await collect(
        engine, engine.apply_chat_template(QUESTION), SamplingParams(max_tokens=32, temperature=0)
    )
    assert "Paris" in text


async def test_unknown_model_fails_at_start():
    engine = Engine(EngineConfig(model="no-such-model", device="cpu"))
    with pytest.raises(UnknownModelError, match="no-such-model"):
        await engine.start()


async def test_failing_step_ends_its_requests_and_the_loop_goes_on(engine):
    runner = engine.core.runner
    original = runner.launch

    def explode_once(plan, masks=None):
        runner.launch = original
        raise RuntimeError("injected fault")

    victims = [
        collect(engine, "Tell me about bees.", SamplingParams(max_tokens=40, temperature=0)) for _ in range(3)
    ]
    runner.launch = explode_once
    results = await asyncio.gather(*victims, return_exceptions=True)
    failed = [r for r in results if isinstance(r, RequestFailedError)]
    assert failed, results
    assert all(isinstance(r, (RequestFailedError, tuple)) for r in results)
    await wait_until(lambda: engine.stats().kv_blocks_used == 0)
    _, text, _ = await collect(
        engine, engine.apply_chat_template(QUESTION), SamplingParams(max_tokens=32, temperature=0)
    )
    assert text == "The capital of France is Paris."


async def test_prompts_are_split_where_no_mixed_graph_would_run(engine):
    # keep_prompts_whole serves the mixed CUDA graphs; on the CPU nothing is graphed, so a prompt
    # fills whatever budget a step has left rather than waiting a step.
    assert engine.config.keep_prompts_whole and not engine.core.runner.mixed.fresh
    assert engine.core.scheduler.keep_prompts_whole is False
