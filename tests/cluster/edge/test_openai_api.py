"""The OpenAI surface through real Ray Serve, the real model and the real ``openai`` client."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from replica import Engine, SamplingParams
from tests.cluster.helpers import ADMIN, ALICE, METRICS_KEY, MODEL

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


async def engine_text(engine: Engine, prompt_ids: list[int], max_tokens: int) -> str:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return "".join([out.text async for out in engine.generate(prompt_ids, params)])


async def test_chat_greedy_equals_engine(client: openai.OpenAI, engine: Engine) -> None:
    resp = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=16, temperature=0)
    expected = await engine_text(engine, engine.apply_chat_template(QUESTION), 16)
    assert resp.choices[0].message.content == expected
    assert "Paris" in expected
    assert resp.usage.completion_tokens > 0 and resp.usage.prompt_tokens > 0


async def test_streamed_chat_equals_engine_and_reports_usage(client: openai.OpenAI, engine: Engine) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == await engine_text(engine, engine.apply_chat_template(QUESTION), 16)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert chunks[0].choices[0].delta.role == "assistant"


async def test_completion_text_and_token_ids_prompts(client: openai.OpenAI, engine: Engine) -> None:
    prompt = "The capital of France is"
    ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
    expected = await engine_text(engine, ids, 8)
    by_text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    assert by_text.choices[0].text == expected == by_ids.choices[0].text
    assert by_text.usage.prompt_tokens == len(ids)


def test_streamed_completion_ends_with_done(base_url: str) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "stream": True}
    r = httpx.post(
        f"{base_url}/v1/completions", json=body, headers={"Authorization": f"Bearer {ALICE}"}, timeout=60
    )
    events = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "data: [DONE]" and len(events) >= 2


def test_bad_key_is_401(base_url: str) -> None:
    bad = openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        bad.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4)
    assert err.value.status_code == 401
    assert err.value.body["type"] == "authentication_error"
    assert httpx.post(f"{base_url}/v1/completions", json={"model": MODEL, "prompt": "x"}).status_code == 401


def test_unknown_field_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="hi", max_tokens=4, extra_body={"frobnicate": 1})
    assert err.value.body["param"] == "frobnicate"
    assert err.value.body["code"] == "extra_forbidden"


def test_over_long_prompt_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=[42] * 9000, max_tokens=4)
    assert err.value.body["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "x", "n": 99},
        {"prompt": "x", "logprobs": 21},
        {"prompt": "x", "logit_bias": {"99999999": 1}},
        {"prompt": "x", "logit_bias": {"5": 101}},
        {"prompt": "x", "top_k": -2},
        {"prompt": "x", "min_tokens": 50, "max_tokens": 10},
        {"prompt": "x", "temperature": -1},
        {"prompt": [10**9]},
        {"prompt": ""},
        {"prompt": "x", "max_tokens": 0},
        {"prompt": []},
        {"prompt": ["a", [1, 2]]},
    ],
)
def test_bad_inputs_are_400_not_500(base_url: str, body: dict) -> None:
    r = httpx.post(
        f"{base_url}/v1/completions",
        json={"model": MODEL, **body},
        headers={"Authorization": f"Bearer {ALICE}"},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_invalid_json_and_unknown_model(base_url: str) -> None:
    auth = {"Authorization": f"Bearer {ALICE}", "content-type": "application/json"}
    assert httpx.post(f"{base_url}/v1/completions", content=b"{nope", headers=auth).status_code == 400
    r = httpx.post(f"{base_url}/v1/completions", json={"model": "gpt-9", "prompt": "x"}, headers=auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_models_health_metrics_sla(base_url: str, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{base_url}/health").json()["status"] == "ok"
    metrics = httpx.get(f"{base_url}/metrics", headers=ADMIN).text
    assert 'fairlane_requests_total{outcome="ok",sla_class="interactive",tenant="alice"}' in metrics
    assert "fairlane_ttft_seconds_bucket" in metrics and "fairlane_replica_kv_usage" in metrics
    mine = httpx.get(f"{base_url}/v1/tenants/me/sla", headers={"Authorization": f"Bearer {ALICE}"}).json()
    assert [t["tenant_id"] for t in mine["tenants"]] == ["alice"]
    assert mine["tenants"][0]["ok"] >= 1 and mine["tenants"][0]["ttft_s"]["p50"] > 0


def test_every_error_answer_is_counted(base_url: str) -> None:
    """Issue 19, defect 10: 401, 404 and 400 answers reach Prometheus, by route and status."""

    def counts() -> dict[tuple[str, str], float]:
        text = httpx.get(f"{base_url}/metrics", headers=ADMIN).text
        return {
            (sample.labels["route"], sample.labels["status"]): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "fairlane_http_errors_total"
        }

    before = counts()
    auth = {"Authorization": f"Bearer {ALICE}"}
    assert httpx.post(f"{base_url}/v1/completions", json={"model": MODEL, "prompt": "x"}).status_code == 401
    missing = httpx.post(f"{base_url}/v1/completions", json={"model": "gpt-9", "prompt": "x"}, headers=auth)
    assert missing.status_code == 404
    bad = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": -1}
    assert httpx.post(f"{base_url}/v1/chat/completions", json=bad, headers=auth).status_code == 400
    assert httpx.get(f"{base_url}/v1/no-such-route", headers=auth).status_code == 404
    after = counts()

    def grew(route: str, status: str) -> float:
        return after.get((route, status), 0) - before.get((route, status), 0)

    assert grew("/v1/completions", "401") >= 1 and grew("/v1/completions", "404") >= 1
    assert grew("/v1/chat/completions", "400") >= 1 and grew("other", "404") >= 1


def test_metrics_are_for_operators_only(base_url: str) -> None:
    """Issue 19, defect 11: the counters name every tenant and its traffic. Without a key: 401; a
    tenant's key: 403; the metrics key (a scraper's) or the admin key: the page."""
    assert httpx.get(f"{base_url}/metrics").status_code == 401
    tenant = httpx.get(f"{base_url}/metrics", headers={"Authorization": f"Bearer {ALICE}"})
    assert tenant.status_code == 403 and tenant.json()["error"]["code"] == "metrics_only"
    assert "fairlane_requests_total" in httpx.get(f"{base_url}/metrics", headers=ADMIN).text
    scraper = {"Authorization": f"Bearer {METRICS_KEY}"}
    assert "fairlane_requests_total" in httpx.get(f"{base_url}/metrics", headers=scraper).text
    assert httpx.get(f"{base_url}/admin/sla", headers=scraper).status_code == 401  # nothing else


def test_admin_routes_need_the_admin_key(base_url: str) -> None:
    alice = {"Authorization": f"Bearer {ALICE}"}
    assert httpx.get(f"{base_url}/admin/sla", headers=alice).status_code == 403
    assert httpx.get(f"{base_url}/admin/sla").status_code == 401
    report = httpx.get(f"{base_url}/admin/sla", headers=ADMIN).json()
    assert {c["sla_class"] for c in report["classes"]} >= {"interactive"}
    reload = httpx.post(f"{base_url}/admin/tenants/reload", headers=ADMIN)
    assert reload.status_code == 200 and "alice" in reload.json()["tenants"]


def test_body_over_limit_is_413(base_url: str) -> None:
    big = "x" * 4_100_000
    r = httpx.post(
        f"{base_url}/v1/completions",
        json={"model": MODEL, "prompt": big},
        headers={"Authorization": f"Bearer {ALICE}"},
        timeout=60,
    )
    assert r.status_code == 413
