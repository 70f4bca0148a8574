"""Where a request's first token went, from the router's own records: the HTTP request's entry into
the router's app, arrival, dispatch, the engine's own arrival → first step → first token, and the
router's first token. And the router's collector: its start-up heap frozen, its pauses reported."""

from __future__ import annotations

import uuid

import httpx
import openai

from tests.cluster.helpers import ADMIN, MODEL, admin_state, wait_until


def _record_of(base_url: str, user: str) -> dict:
    """The request's timing record: written when the router closes it, which for a stream is just
    after its last bytes left (the client may read them first)."""
    mine: list[dict] = []

    def recorded() -> bool:
        records = httpx.get(f"{base_url}/admin/timings", headers=ADMIN, timeout=30).json()["records"]
        mine[:] = [r for r in records if r["user"] == user]
        return bool(mine)

    assert wait_until(recorded, timeout_s=10.0)
    assert len(mine) == 1, mine
    return mine[0]


def test_a_streamed_answer_records_each_stage_in_order(client: openai.OpenAI, base_url: str) -> None:
    user = f"stages-{uuid.uuid4().hex[:8]}"
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=6,
        stream=True,
        user=user,
    )
    # Read to its end: the record is written when the router closes the stream, and ``any`` alone
    # stopped at the first piece, leaving the rest of the answer (on a loaded box, seconds of it)
    # inside the record's 10-s wait.
    chunks = list(stream)
    assert any(c.choices and c.choices[0].delta.content for c in chunks)
    t = _record_of(base_url, user)
    assert t["outcome"] == "ok"
    # One host, one monotonic clock: each stage follows the one before it.
    assert t["received"] <= t["arrival"] <= t["dispatched"] <= t["first_token"] <= t["end"]
    # The engine's durations (its own clock) fit inside the router's dispatch → first token.
    assert 0 <= t["engine_queue"] <= t["engine_ttft"] <= t["first_token"] - t["dispatched"]


def test_a_whole_answer_records_the_engine_stages_too(client: openai.OpenAI, base_url: str) -> None:
    user = f"stages-{uuid.uuid4().hex[:8]}"
    client.completions.create(model=MODEL, prompt="One, two,", max_tokens=4, user=user)
    t = _record_of(base_url, user)
    assert t["received"] <= t["arrival"] and t["engine_ttft"] is not None
    assert 0 <= t["engine_queue"] <= t["engine_ttft"] <= t["first_token"] - t["dispatched"]


def test_the_router_froze_its_start_up_heap_and_reports_its_pauses(base_url: str) -> None:
    gc = admin_state(base_url)["gc"]
    assert gc["frozen_objects"] > 10_000  # Ray, Serve, FastAPI and pydantic's objects at least
    assert len(gc["generations"]) == 3
    assert gc["max_ms"] == max(g["max_ms"] for g in gc["generations"])
