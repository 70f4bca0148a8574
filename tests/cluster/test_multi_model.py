"""Two models in one application: each with its own replicas, fair queue and quotas, and tenants that
may use some of them; LoRA adapters on one of them, each a tenant's own (real Ray Serve, the real
openai client)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from ray import serve

from tenancy import DEMO_KEY_SALT, hash_api_key
from tests.cluster.helpers import ADMIN, ALICE, BOB, admin_state, start_app, wait_until, write_tenancy
from tests.lora_files import SMOLLM2_135M, write_lora

APP = "fl-multi"
SMALL, RANDOM = "small", "smol-random"  # SmolLM2; the same shape with random weights and word tokens
METERED_KEY = "sk-test-metered"  # 2 requests per minute, 3 on RANDOM (a per-model override)
ADAPTER, LATE = "alice-sql", "alice-late"  # alice's LoRA adapters on SMALL: in the config, and at run time


def _tenancy(path: Path) -> Path:
    """The cluster tests' tenants; bob may use SMALL only, and a metered tenant has per-model limits."""
    data = yaml.safe_load(write_tenancy(path).read_text())
    for tenant in data["tenants"]:
        if tenant["id"] == "bob":
            tenant["models"] = [SMALL]
        if tenant["id"] == "alice":
            tenant["adapters"] = [ADAPTER, LATE]
    metered = {
        "id": "metered",
        "display_name": "metered",
        "api_key_hashes": [hash_api_key(METERED_KEY, DEMO_KEY_SALT)],
        "weight": 1.0,
        "sla_class": "standard",
        "quotas": {
            "requests_per_minute": 2,
            "tokens_per_minute": 100_000,
            "max_concurrent_requests": 8,
            "max_tokens_per_request": 256,
            "max_context_length": 4096,
        },
        "model_quotas": [{"model": RANDOM, "requests_per_minute": 3}],
    }
    data["tenants"].append(metered)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def multi_url(ray_serve: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("multi")
    tenancy = _tenancy(folder / "tenants.yaml")
    adapter = write_lora(folder / ADAPTER, **SMOLLM2_135M, seed=1)
    config = {
        "engine": {"device": "cpu", "kv_cache_tokens": 2048, "max_num_seqs": 8},
        "models": [
            # One request in flight on SMALL: a few long requests make a backlog in its queue.
            {
                "name": SMALL,
                "replica_room": 1,
                "engine": {"lora_slots": 2, "max_lora_rank": 8, "lora_adapters": {ADAPTER: str(adapter)}},
            },
            {"name": RANDOM, "engine": {"random_weights": True, "synthetic_tokenizer": True}},
        ],
        "tenancy_config": str(tenancy),
        "replica_room": 2,
        "load_poll_interval_s": 0.5,
        "queue_timeout_s": 600.0,
        "router_on_serve_loop": False,  # Serve's default thread for user code (the other apps: its loop)
        "loop_holds": True,  # the loop watch, off elsewhere
    }
    start_app(APP, "/multi", config)
    yield f"http://127.0.0.1:{ray_serve}/multi"
    serve.delete(APP)


def _client(base: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)


def _post(base: str, key: str, model: str, timeout_s: float = 120, **body) -> httpx.Response:
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 1, **body}
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{base}/v1/completions", json=body, headers=headers, timeout=timeout_s)


def test_each_model_answers_under_its_own_name(multi_url: str) -> None:
    alice = _client(multi_url, ALICE)
    question = [{"role": "user", "content": "Name a colour."}]
    for model in (SMALL, RANDOM):
        chat = alice.chat.completions.create(model=model, messages=question, max_tokens=4, temperature=0)
        assert chat.model == model and chat.choices[0].finish_reason in ("stop", "length")
        assert chat.usage is not None and chat.usage.completion_tokens >= 1
        stream = alice.completions.create(model=model, prompt="The sky is", max_tokens=3, stream=True)
        assert {chunk.model for chunk in stream} == {model}
    # Each model ran on its own deployment: the first keeps the one-model name.
    status = serve.status().applications[APP].deployments
    assert {"Replica", f"Replica-{RANDOM}", "Router"} <= set(status)
    # router_on_serve_loop off: the router's code runs in Serve's user-code thread.
    state = admin_state(multi_url)
    assert "_run_user_code_event_loop" in state["loop_thread"]
    # Ray's GC thread asks the router's collector clock for full collections (gc_pacer.py).
    assert state["gc_pacer"]["ray_thread_taken"] is True, state["gc_pacer"]
    # loop_holds on: the requests above were steps of the watched loop.
    assert state["loop_holds"]["steps"] > 0 and state["loop_holds"]["longest"], state["loop_holds"]
    # Every replica's own load names its model (/admin/state replica_loads).
    assert wait_until(
        lambda: (
            sorted(v["model"] for v in admin_state(multi_url)["replica_loads"].values())
            == sorted([SMALL, RANDOM])
        )
    )

    # And every replica's step profile, as the routers last polled it, names its model and its steps.
    def profiled() -> list[tuple[str, bool]]:
        profiles = admin_state(multi_url)["replica_profiles"].values()
        return sorted((p["model"], p["total_steps"] > 0 and "hold_ms" in p) for p in profiles)

    assert wait_until(lambda: profiled() == sorted([(SMALL, True), (RANDOM, True)])), profiled()


def test_models_listed_are_those_the_tenant_may_use(multi_url: str) -> None:
    listed = _client(multi_url, ALICE).models.list().data
    assert [m.id for m in listed] == [SMALL, RANDOM, ADAPTER]
    assert listed[2].model_dump()["parent"] == SMALL  # an adapter names its base model
    bob = _client(multi_url, BOB)
    assert [m.id for m in bob.models.list().data] == [SMALL]
    assert bob.models.retrieve(SMALL).id == SMALL
    with pytest.raises(openai.NotFoundError):
        bob.models.retrieve(RANDOM)


def test_a_disallowed_and_an_unknown_model_get_the_same_404(multi_url: str) -> None:
    bob = _client(multi_url, BOB)
    with pytest.raises(openai.NotFoundError) as err:
        bob.chat.completions.create(model=RANDOM, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert err.value.code == "model_not_found"
    disallowed, unknown = _post(multi_url, BOB, RANDOM), _post(multi_url, BOB, "gpt-9")
    assert disallowed.status_code == unknown.status_code == 404
    # One body for both, the name aside: a key cannot tell another tenant's model from no model.
    assert disallowed.json()["error"] == {
        **unknown.json()["error"],
        "message": unknown.json()["error"]["message"].replace("gpt-9", RANDOM),
    }
    assert disallowed.json()["error"]["code"] == "model_not_found"
    assert _post(multi_url, BOB, SMALL).status_code == 200


def test_quotas_are_counted_per_model(multi_url: str) -> None:
    """2 requests a minute on SMALL, 3 on RANDOM (the override): using one takes nothing from the other."""
    assert [_post(multi_url, METERED_KEY, SMALL).status_code for _ in range(2)] == [200, 200]
    refused = _post(multi_url, METERED_KEY, SMALL)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rpm"
    assert refused.headers["x-ratelimit-limit-requests"] == "2"
    assert [_post(multi_url, METERED_KEY, RANDOM).status_code for _ in range(3)] == [200, 200, 200]
    refused = _post(multi_url, METERED_KEY, RANDOM)
    assert refused.status_code == 429 and refused.headers["x-ratelimit-limit-requests"] == "3"


@pytest.mark.slow
def test_one_models_backlog_takes_nothing_from_the_other(multi_url: str) -> None:
    """SMALL's queue fills (room 1, five long answers); RANDOM's request is dispatched at once."""
    httpx.post(f"{multi_url}/admin/timings/reset", headers=ADMIN, timeout=10)
    statuses: list[int | str] = []
    lock = threading.Lock()

    def long_answer() -> None:
        # The fifth waits behind four long answers on one slot: on a loaded two-core box that can
        # pass two minutes, so the client waits as long as the join below does. A client-side
        # failure is recorded, never lost in the thread.
        try:
            r = _post(multi_url, ALICE, SMALL, max_tokens=96, ignore_eos=True, temperature=0, timeout_s=300)
            outcome: int | str = r.status_code
        except httpx.HTTPError as exc:
            outcome = repr(exc)
        with lock:
            statuses.append(outcome)

    flood = [threading.Thread(target=long_answer, daemon=True) for _ in range(5)]
    for t in flood:
        t.start()
    try:
        assert wait_until(lambda: admin_state(multi_url)["models"][SMALL]["queued"] >= 2, timeout_s=60)
        started = time.monotonic()
        answer = _client(multi_url, ALICE).completions.create(model=RANDOM, prompt="Hello", max_tokens=4)
        took = time.monotonic() - started
        state = admin_state(multi_url)
    finally:
        for t in flood:
            t.join(timeout=300)
    assert answer.choices[0].finish_reason in ("stop", "length")
    # SMALL still had a backlog when RANDOM's answer was complete: it did not wait behind it.
    assert state["models"][SMALL]["queued"] >= 1 and state["models"][RANDOM]["queued"] == 0
    assert state["queued"] == state["models"][SMALL]["queued"]  # the totals sum the models
    assert statuses == [200] * 5
    records = httpx.get(f"{multi_url}/admin/timings", headers=ADMIN, timeout=10).json()["records"]
    waits = {
        m: [r["dispatched"] - r["admitted"] for r in records if r["model"] == m] for m in (SMALL, RANDOM)
    }
    assert len(waits[RANDOM]) == 1 and waits[RANDOM][0] < 0.05, (waits, took)
    assert max(waits[SMALL]) > 1.0  # SMALL's requests did wait for its one slot
    report = httpx.get(f"{multi_url}/admin/sla", headers=ADMIN, timeout=10).json()
    assert {g["model"]: g["ok"] for g in report["models"]} == {SMALL: 5, RANDOM: 1}
    assert set(report["model_replica_seconds"]) == {SMALL, RANDOM}


def test_per_pool_metrics_carry_the_model(multi_url: str) -> None:
    metrics = httpx.get(f"{multi_url}/metrics", headers=ADMIN, timeout=10).text
    for model in (SMALL, RANDOM):
        assert f'fairlane_replicas{{model="{model}"}} 1.0' in metrics
        assert f'fairlane_dispatch_room{{model="{model}"}}' in metrics
        assert f'model="{model}",replica="' in metrics  # the replica gauges
    health = httpx.get(f"{multi_url}/health", timeout=10).json()
    assert health["status"] == "ok" and health["models"] == {SMALL: 1, RANDOM: 1}


def _greedy(base: str, key: str, model: str) -> httpx.Response:
    return _post(base, key, model, prompt="The capital of France is", max_tokens=8, temperature=0)


def test_an_adapter_answers_under_its_own_name_with_its_own_weights(multi_url: str) -> None:
    base, tuned = _greedy(multi_url, ALICE, SMALL), _greedy(multi_url, ALICE, ADAPTER)
    assert base.status_code == tuned.status_code == 200, tuned.text
    assert tuned.json()["model"] == ADAPTER
    assert tuned.json()["choices"][0]["text"] != base.json()["choices"][0]["text"]
    again = _greedy(multi_url, ALICE, ADAPTER).json()["choices"][0]["text"]
    assert again == tuned.json()["choices"][0]["text"]  # not the base's prefix-cached blocks either
    # The base model, asked again beside the adapter, answers as before.
    assert _greedy(multi_url, ALICE, SMALL).json()["choices"][0]["text"] == base.json()["choices"][0]["text"]
    records = httpx.get(f"{multi_url}/admin/timings", headers=ADMIN, timeout=30).json()["records"]
    mine = [r for r in records if r["request_id"] == tuned.json()["id"].removeprefix("cmpl-")]
    assert [(r["model"], r["adapter"]) for r in mine] == [(SMALL, ADAPTER)]


def test_another_tenants_adapter_is_a_404_like_an_unknown_model(multi_url: str) -> None:
    assert ADAPTER not in [m.id for m in _client(multi_url, BOB).models.list().data]
    theirs, unknown = _post(multi_url, BOB, ADAPTER), _post(multi_url, BOB, "gpt-9")
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json()["error"]["message"].replace(ADAPTER, "gpt-9") == unknown.json()["error"]["message"]


def test_an_adapter_registered_at_run_time_is_served_then_removed(
    multi_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    folder = tmp_path_factory.mktemp("late")
    path = write_lora(folder / LATE, **SMOLLM2_135M, rank=4, modules=("q_proj", "v_proj"), seed=2)
    url = f"{multi_url}/admin/adapters"
    assert _post(multi_url, ALICE, LATE).status_code == 404  # not registered yet
    bad = httpx.post(url, json={"name": LATE, "model": SMALL, "path": str(folder / "none")}, headers=ADMIN)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_adapter", bad.text
    clash = httpx.post(url, json={"name": RANDOM, "model": SMALL, "path": str(path)}, headers=ADMIN)
    assert clash.status_code == 400 and clash.json()["error"]["code"] == "adapter_conflict"
    tenant_key = {"Authorization": f"Bearer {ALICE}"}
    assert (
        httpx.post(
            url, json={"name": LATE, "model": SMALL, "path": str(path)}, headers=tenant_key
        ).status_code
        == 403
    )
    made = httpx.post(url, json={"name": LATE, "model": SMALL, "path": str(path)}, headers=ADMIN, timeout=60)
    assert made.status_code == 201, made.text
    listed = httpx.get(url, headers=ADMIN).json()["adapters"]
    assert {(a["name"], a["source"]) for a in listed} == {(ADAPTER, "config"), (LATE, "admin")}
    late = _greedy(multi_url, ALICE, LATE)
    assert late.status_code == 200, late.text
    assert late.json()["choices"][0]["text"] != _greedy(multi_url, ALICE, SMALL).json()["choices"][0]["text"]
    assert httpx.delete(f"{url}/{LATE}", headers=ADMIN).status_code == 200
    assert _post(multi_url, ALICE, LATE).status_code == 404
    assert httpx.delete(f"{url}/{ADAPTER}", headers=ADMIN).status_code == 400  # the config's own
