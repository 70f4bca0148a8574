"""Tokenizing never holds a router's event loop (issue 19, defect 9): text that cannot fit the
context is refused before any tokenizing, and long text is tokenized on a worker thread."""

from __future__ import annotations

import threading

import pytest

from cluster.config import AppConfig
from cluster.edge.job_builder import JobBuilder
from cluster.edge.openai_schemas import ChatCompletionRequest, CompletionRequest
from cluster.errors import BadRequest
from cluster.text.prompts import PromptEncoder
from tenancy import default_tenancy_config

CONTEXT = 64


class SpyEncoder(PromptEncoder):
    """The real tokenizer, recording which thread each call ran on."""

    def __init__(self) -> None:
        real = PromptEncoder.for_model("smollm2-135m", random_weights=False)
        super().__init__(real._tok, real.vocab_size)
        self.threads: list[int] = []

    def completion(self, prompt):
        self.threads.append(threading.get_ident())
        return super().completion(prompt)

    def chat(self, messages, *tool_args):
        self.threads.append(threading.get_ident())
        return super().chat(messages, *tool_args)


@pytest.fixture(scope="module")
def encoder() -> SpyEncoder:
    return SpyEncoder()


def _builder(encoder: SpyEncoder) -> JobBuilder:
    async def context() -> int:
        return CONTEXT

    return JobBuilder(AppConfig(), encoder, context)


async def test_text_that_cannot_fit_is_refused_before_tokenizing(encoder: SpyEncoder) -> None:
    encoder.threads.clear()
    huge = "word " * (CONTEXT * encoder.max_token_chars // 5 + 1)  # 4 MB of text would do the same
    tenant = default_tenancy_config().tenants[0]
    body = CompletionRequest(model="smollm2-135m", prompt=huge)
    with pytest.raises(BadRequest) as err:
        await _builder(encoder).build("r1", tenant, body)
    assert err.value.code == "context_length_exceeded" and err.value.param == "prompt"
    assert encoder.threads == []  # refused on its length alone


async def test_long_text_is_tokenized_off_the_event_loop(encoder: SpyEncoder) -> None:
    encoder.threads.clear()
    text = "A short word. " * 320  # 4,480 characters: past the inline bound, within the character bound
    tenant = default_tenancy_config().tenants[0]
    body = ChatCompletionRequest(model="smollm2-135m", messages=[{"role": "user", "content": text}])
    with pytest.raises(BadRequest) as err:  # ~1,000 tokens: the token check still refuses it
        await _builder(encoder).build("r2", tenant, body)
    assert err.value.code == "context_length_exceeded"
    assert len(encoder.threads) == 1 and encoder.threads[0] != threading.get_ident()
    short = CompletionRequest(model="smollm2-135m", prompt="Hello there", max_tokens=4)
    job = await _builder(encoder).build("r3", tenant, short)
    assert job.prompt_ids and encoder.threads[-1] == threading.get_ident()  # short text: inline
