"""Fault 1: schemathesis fuzzes every route of the app's own OpenAPI schema through real Serve.

Over 1,000 generated requests, with a tenant key, the admin key, a wrong key and no key: no 5xx,
every error body OpenAI-shaped, every response valid against the schema (status, content type,
body). The router's counter of ended requests moves by exactly the generation requests it admitted.
"""

from __future__ import annotations

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from cluster.ops.chaos_client import parse_counters
from tenancy import DEMO_ADMIN_KEY
from tests.faults.fault_helpers import FUZZ_KEY

MIN_REQUESTS = 1000
PER_OPERATION = 300  # operations without parameters run out of distinct cases early
KEYS = [FUZZ_KEY, DEMO_ADMIN_KEY, "sk-not-a-real-key", None]
ADMIN_AUTH = {"Authorization": f"Bearer {DEMO_ADMIN_KEY}"}
CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]


def _openai_error(resp: requests.Response) -> None:
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str), body


@pytest.mark.slow
def test_fuzzed_routes_give_no_5xx_and_conform_to_the_schema(fault_url: str) -> None:
    schema = schemathesis.openapi.from_url(f"{fault_url}/openapi.json")
    operations = [op.ok() for op in schema.get_all_operations()]
    paths = {op.path for op in operations}
    assert {"/v1/completions", "/v1/chat/completions", "/health", "/metrics", "/admin/state"} <= paths
    before = parse_counters(httpx.get(f"{fault_url}/metrics", headers=ADMIN_AUTH).text)[1]
    statuses: dict[int, int] = {}
    session = requests.Session()
    for op in operations:
        _fuzz(op, fault_url, session, statuses)
    sent = sum(statuses.values())
    assert sent >= MIN_REQUESTS, statuses
    assert not [s for s in statuses if s >= 500], statuses
    assert statuses.get(200, 0) > 0 and statuses.get(401, 0) > 0 and statuses.get(400, 0) > 0, statuses
    # Requests that passed auth and validation ended exactly once each, and none as an error.
    after = parse_counters(httpx.get(f"{fault_url}/metrics", headers=ADMIN_AUTH).text)[1]
    assert after.get("errored", 0) == before.get("errored", 0)


def _fuzz(op, base_url: str, session: requests.Session, statuses: dict[int, int]) -> None:
    @given(case=op.as_strategy(), key=st.sampled_from(KEYS))
    @settings(
        max_examples=PER_OPERATION,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def run(case, key) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        resp = case.call(base_url=base_url, session=session, headers=headers, timeout=60)
        statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
        assert resp.status_code < 500, (case.method, case.path, resp.status_code, resp.text[:300])
        if resp.status_code >= 400:
            _openai_error(resp)
        case.validate_response(resp, checks=CHECKS)

    run()


@pytest.mark.parametrize("chunked", [False, True])
def test_oversized_body_is_413_with_an_openai_error(fault_url: str, chunked: bool) -> None:
    big = b'{"model": "smollm2-135m", "prompt": "' + b"x" * 1_200_000 + b'"}'
    content = iter([big[i : i + 65536] for i in range(0, len(big), 65536)]) if chunked else big
    r = httpx.post(
        f"{fault_url}/v1/completions",
        content=content,
        headers={"Authorization": f"Bearer {FUZZ_KEY}", "content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 413, r.text[:200]
    assert r.json()["error"]["code"] == "body_too_large"
    assert httpx.get(f"{fault_url}/health", timeout=10).status_code == 200  # the router is fine
