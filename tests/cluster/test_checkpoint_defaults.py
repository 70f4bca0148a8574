"""A checkpoint's own settings at the router: its recommended sampling values fill the fields a
request leaves out, and a chat answer without max_tokens may run to the end of the context."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cluster.config import AppConfig
from cluster.edge.job_builder import JobBuilder
from cluster.edge.openai_schemas import ChatCompletionRequest, CompletionRequest
from cluster.text.prompts import PromptEncoder, tokenizer_dir
from tenancy import default_tenancy_config

CONTEXT = 512
HELLO = [{"role": "user", "content": "Hello!"}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded default's tokenizer files with a Llama-3.1-instruct-like generation config."""
    src, out = tokenizer_dir("smollm2-135m"), tmp_path_factory.mktemp("ckpt")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    generation = {"eos_token_id": [2, 0], "temperature": 0.6, "top_p": 0.9, "do_sample": True}
    (out / "generation_config.json").write_text(json.dumps(generation))
    return out


def builder(checkpoint: Path, **cfg) -> JobBuilder:
    async def context() -> int:
        return CONTEXT

    return JobBuilder(
        AppConfig(**cfg), PromptEncoder.for_model(str(checkpoint), random_weights=False), context
    )


async def test_the_checkpoint_fills_only_what_the_request_leaves_out(checkpoint: Path) -> None:
    tenant = default_tenancy_config().tenants[0]
    jobs = builder(checkpoint)
    plain = await jobs.build("a", tenant, ChatCompletionRequest(model="smollm2-135m", messages=HELLO))
    assert plain.sampling["temperature"] == 0.6 and plain.sampling["top_p"] == 0.9
    own = ChatCompletionRequest(model="smollm2-135m", messages=HELLO, temperature=1.0, top_p=0.5)
    mine = await jobs.build("b", tenant, own)
    assert mine.sampling["temperature"] == 1.0 and mine.sampling["top_p"] == 0.5
    greedy = await jobs.build(
        "c", tenant, CompletionRequest(model="smollm2-135m", prompt="Hi", temperature=0)
    )
    assert greedy.sampling["temperature"] == 0 and greedy.sampling["top_p"] == 0.9


async def test_a_chat_answer_without_max_tokens_may_fill_the_context(checkpoint: Path) -> None:
    tenant = default_tenancy_config().tenants[0]
    job = await builder(checkpoint).build(
        "d", tenant, ChatCompletionRequest(model="smollm2-135m", messages=HELLO)
    )
    assert job.sampling["max_tokens"] == CONTEXT - len(job.prompt_ids)
    capped = builder(checkpoint, chat_default_max_tokens=100)
    job = await capped.build("e", tenant, ChatCompletionRequest(model="smollm2-135m", messages=HELLO))
    assert job.sampling["max_tokens"] == 100
    asked = ChatCompletionRequest(model="smollm2-135m", messages=HELLO, max_completion_tokens=7)
    assert (await capped.build("f", tenant, asked)).sampling["max_tokens"] == 7
    completion = await capped.build("g", tenant, CompletionRequest(model="smollm2-135m", prompt="Hi"))
    assert completion.sampling["max_tokens"] == 16  # completions keep OpenAI's default
