"""Prefix caching through real Ray Serve and the real ``openai`` client: a tenant's repeated prompt
is served from its own cache (usage.prompt_tokens_details.cached_tokens), another tenant sending
the same prompt is not, and a cache_salt keeps a request out of the tenant's unsalted cache."""

from __future__ import annotations

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from cluster.serving.wire import GenerateArgs
from tests.cluster.helpers import ADMIN, BOB, MODEL

SYSTEM = (
    "You are the support assistant of the river town's library. Answer in one short sentence. "
    "The library opens at nine and closes at six, except on Sundays, when it is closed. Members may "
    "borrow up to eight books for three weeks, renew them twice online, and reserve new titles. "
    "The reading room on the first floor is quiet; the children's corner is downstairs by the garden."
)


def _ask(client: openai.OpenAI, question: str, **extra) -> openai.types.chat.ChatCompletion:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=4, temperature=0, extra_body=extra or None
    )


def _cached(resp) -> int:
    return resp.usage.prompt_tokens_details.cached_tokens


def test_a_tenant_hits_its_own_cache_and_never_another_tenants(base_url: str, client: openai.OpenAI) -> None:
    bob = openai.OpenAI(base_url=f"{base_url}/v1", api_key=BOB, max_retries=0, timeout=120)
    question = "When does the library open on Mondays?"
    first = _ask(client, question)  # alice
    assert first.usage.prompt_tokens > 64
    assert _cached(_ask(bob, question)) == 0  # alice's exact prompt, from another tenant
    again = _ask(client, question)
    assert 0 < _cached(again) < again.usage.prompt_tokens
    assert _cached(again) % 16 == 0  # whole KV blocks
    assert again.choices[0].message.content == first.choices[0].message.content
    assert _cached(_ask(client, question, cache_salt="salt-1")) == 0  # salted: not the unsalted cache
    assert _cached(_ask(client, question, cache_salt="salt-1")) > 0


def test_streamed_usage_reports_cached_tokens(client: openai.OpenAI) -> None:
    question = "How many books may a member borrow?"
    _ask(client, question)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = list(stream)[-1].usage
    assert 0 < usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens


def test_cached_tokens_are_counted_per_tenant(base_url: str, client: openai.OpenAI) -> None:
    _ask(client, "Is the library open on Sundays?")
    _ask(client, "Is the library open on Sundays?")
    text = httpx.get(f"{base_url}/metrics", headers=ADMIN).text
    cached = {
        sample.labels["tenant"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "fairlane_cached_prompt_tokens_total"
    }
    assert cached.get("alice", 0) > 0


def test_cache_scopes_keep_tenants_and_groups_apart() -> None:
    def scope(tenant=None, group=None, salt=None) -> str:
        return GenerateArgs("r", [1], tenant=tenant, cache_group=group, cache_salt=salt).cache_scope()

    assert scope("alice") == scope("alice") != scope("bob")
    assert scope("alice", group="g") == scope("bob", group="g")  # one cache group shares
    assert scope("g") != scope("bob", group="g")  # a tenant named like a group is not in it
    assert scope("alice", salt="s") != scope("alice") and scope("alice", salt="s") != scope("bob", salt="s")
