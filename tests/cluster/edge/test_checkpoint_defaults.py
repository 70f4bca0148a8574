"""A checkpoint's own settings at the router: its recommended sampling values fill the fields a
request leaves out, and a chat answer without max_tokens may run to the end of the context, within
what the tenant may ask (its max_tokens_per_request and context); those caps apply per choice."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cluster.config import AppConfig
from cluster.edge.job_builder import JobBuilder
from cluster.edge.openai_schemas import ChatCompletionRequest, CompletionRequest
from cluster.text.prompts import PromptEncoder, tokenizer_dir
from tenancy import QuotaManager, RequestLimitExceeded, default_tenancy_config

CONTEXT = 512
SMOLLM2_CONTEXT = 8192  # the embedded default's own (and the shipped tenants' max_context_length)
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


def builder(checkpoint: Path, context_len: int = CONTEXT, **cfg) -> JobBuilder:
    async def context() -> int:
        return context_len

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


async def test_the_plainest_chat_call_fits_the_shipped_tenant(checkpoint: Path) -> None:
    """No max_tokens, the model's whole 8,192-token context: the default is the tenant's own cap
    (1,024 for the shipped tenants), and admission takes it, where it used to refuse 8,169 > 1,024."""
    tenancy = default_tenancy_config()
    tenant = tenancy.tenants[0]
    cap = tenant.quotas.max_tokens_per_request
    assert cap < SMOLLM2_CONTEXT  # the case the clamp exists for
    jobs = builder(checkpoint, context_len=SMOLLM2_CONTEXT)
    job = await jobs.build("h", tenant, ChatCompletionRequest(model="smollm2-135m", messages=HELLO))
    assert job.sampling["max_tokens"] == cap
    quotas = QuotaManager(tenancy)
    assert quotas.check_request(tenant, len(job.prompt_ids), job.max_tokens, job.choices) == (
        len(job.prompt_ids) + cap  # the reservation counts the same figure
    )
    completion = await jobs.build("i", tenant, CompletionRequest(model="smollm2-135m", prompt="Hi"))
    assert completion.sampling["max_tokens"] == 16


async def test_an_explicit_max_tokens_above_the_cap_is_still_refused(checkpoint: Path) -> None:
    tenancy = default_tenancy_config()
    tenant = tenancy.tenants[0]
    cap = tenant.quotas.max_tokens_per_request
    body = ChatCompletionRequest(model="smollm2-135m", messages=HELLO, max_tokens=cap + 1)
    job = await builder(checkpoint, context_len=SMOLLM2_CONTEXT).build("j", tenant, body)
    with pytest.raises(RequestLimitExceeded, match="max_tokens_per_request"):
        QuotaManager(tenancy).check_request(tenant, len(job.prompt_ids), job.max_tokens, job.choices)


async def test_the_caps_apply_per_choice(checkpoint: Path) -> None:
    """n=2 at the cap: each answer is within it, so the request is valid; the reservation (tokens per
    minute) is both answers."""
    tenancy = default_tenancy_config()
    tenant = tenancy.tenants[0]
    cap = tenant.quotas.max_tokens_per_request
    body = ChatCompletionRequest(model="smollm2-135m", messages=HELLO, max_tokens=cap, n=2)
    job = await builder(checkpoint, context_len=SMOLLM2_CONTEXT).build("k", tenant, body)
    assert (job.choices, job.max_tokens) == (2, 2 * cap)
    quotas = QuotaManager(tenancy)
    assert quotas.check_request(tenant, len(job.prompt_ids), job.max_tokens, job.choices) == (
        len(job.prompt_ids) + 2 * cap
    )
    with pytest.raises(RequestLimitExceeded, match="max_tokens_per_request"):  # n answers of cap + 1
        quotas.check_request(tenant, len(job.prompt_ids), 2 * (cap + 1), 2)
    best = CompletionRequest(model="smollm2-135m", prompt="Hi", max_tokens=cap, n=1, best_of=3)
    ranked = await builder(checkpoint, context_len=SMOLLM2_CONTEXT).build("l", tenant, best)
    assert quotas.check_request(tenant, len(ranked.prompt_ids), ranked.max_tokens, ranked.choices) == (
        len(ranked.prompt_ids) + 3 * cap
    )
