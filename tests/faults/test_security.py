"""Security: keys and text stay out of logs, metrics, errors and reports; tenants see only
themselves; admin routes need the admin key; limits answer 400/413 with OpenAI errors."""

from __future__ import annotations

import httpx
import pytest

from tenancy import DEMO_ADMIN_KEY, DEMO_KEYS
from tests.faults.fault_helpers import FAULT_APP, FUZZ_KEY, MODEL, log_offsets, log_text_since, serve_logs

ALICE = DEMO_KEYS["alice"]
CANARY_KEY = "sk-canary-3b7d0e51-not-a-key"
CANARY_TEXT = "zebra-canary-prompt-41d9"


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _chat(url: str, key: str, content: str, **extra) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4} | extra
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=_auth(key), timeout=60)


def test_keys_and_text_never_leak(fault_url: str) -> None:
    paths = serve_logs(FAULT_APP)
    offsets = log_offsets(paths)
    bad = _chat(fault_url, CANARY_KEY, CANARY_TEXT)
    assert bad.status_code == 401 and CANARY_KEY not in bad.text
    ok = _chat(fault_url, ALICE, f"Repeat: {CANARY_TEXT}")
    assert ok.status_code == 200
    admin = _auth(DEMO_ADMIN_KEY)
    pages = [
        httpx.get(f"{fault_url}/metrics", headers=admin).text,
        httpx.get(f"{fault_url}/admin/sla", headers=admin).text,
        httpx.get(f"{fault_url}/admin/timings", headers=admin).text,
        httpx.get(f"{fault_url}/v1/tenants/me/sla", headers=_auth(ALICE)).text,
        httpx.get(f"{fault_url}/v1/tenants/me/usage", headers=_auth(ALICE)).text,
    ]
    secrets = [CANARY_KEY, ALICE, DEMO_ADMIN_KEY, FUZZ_KEY, CANARY_TEXT]
    for page in pages:
        assert not [s for s in secrets if s in page], page[:300]
    assert 'tenant="alice"' in pages[0]  # metrics carry tenant ids
    logged = log_text_since(paths, offsets)
    assert logged  # the access log did record the requests
    assert not [s for s in secrets if s in logged]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/tenants/bob/sla",
        "/v1/tenants/bob/usage",
        "/v1/tenants/nobody/sla",
        "/v1/tenants/me/sla?tenant=bob",
    ],
)
def test_a_tenant_reads_only_itself(fault_url: str, path: str) -> None:
    r = httpx.get(f"{fault_url}{path}", headers=_auth(ALICE), timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "tenant_not_found"


def test_own_usage_and_sla_and_admin_guard(fault_url: str) -> None:
    _chat(fault_url, ALICE, "Say hi.")
    usage = httpx.get(f"{fault_url}/v1/tenants/alice/usage", headers=_auth(ALICE)).json()
    assert usage["tenant_id"] == "alice" and usage["requests"] >= 1
    sla = httpx.get(f"{fault_url}/v1/tenants/alice/sla", headers=_auth(ALICE)).json()
    assert {t["tenant_id"] for t in sla["tenants"]} == {"alice"}
    for route in ("/admin/sla", "/admin/state", "/admin/timings"):
        assert httpx.get(f"{fault_url}{route}", headers=_auth(ALICE)).status_code == 403
        assert httpx.get(f"{fault_url}{route}").status_code == 401
    assert httpx.post(f"{fault_url}/admin/timings/reset", headers=_auth(ALICE)).status_code == 403


@pytest.mark.parametrize(
    ("extra", "content", "code"),
    [
        ({"max_tokens": 5}, "hi", "max_tokens_per_request"),  # the fuzz tenant allows 4
        ({}, "word " * 400, "context_length_exceeded"),  # over its 256-token context
        ({"stop": ["a", "b", "c", "d", "e"]}, "hi", None),
        ({"stop": "x" * 300}, "hi", None),
    ],
)
def test_limits_are_clear_400s(fault_url: str, extra: dict, content: str, code: str | None) -> None:
    r = _chat(fault_url, FUZZ_KEY, content, **extra)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and (code is None or err["code"] == code), err
