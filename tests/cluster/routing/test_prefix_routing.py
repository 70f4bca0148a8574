"""Replica choice through real Ray Serve, two replicas of the embedded default: with ``prefix`` a
conversation's later turns reach the replica that holds its history (every one finds it cached);
with ``load`` they land by load alone and find less (issue 25). With ``direct_dispatch`` the router
makes the same choice itself and sends past Serve's handle (issue 22)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
from ray import serve

from bench.prefix_routing import run_conversations, summarize
from tests.cluster.helpers import (
    ADMIN,
    ALICE,
    BOB,
    MODEL,
    admin_state,
    deploy_apps,
    wait_running,
    wait_until,
    write_tenancy,
)

CONVERSATIONS, TURNS = 4, 3


def _app(choice: str, tenancy: Path, direct: bool = False) -> tuple[str, str, dict]:
    """(name, route prefix, config) of one run's app: two replicas of the embedded default."""
    name, path = (f"fl-choice-{choice}", f"/{choice}") if not direct else ("fl-direct", "/direct")
    config = {
        "engine": {"device": "cpu", "kv_cache_tokens": 16384, "max_num_seqs": 16},
        "tenancy_config": str(tenancy),
        "num_replicas": 2,
        "replica_room": 4,
        "replica_choice": choice,
        "queue_timeout_s": 600.0,
        "direct_dispatch": direct,
        # Ray's logical CPUs, not a core each: two of these apps (four replicas) at once beside the
        # shared app's replica fit the test Ray's 6 with room to spare.
        "replica_num_cpus": 0.5,
    }
    return name, path, config


def _run(app: tuple[str, str, dict], port: int) -> list[dict]:
    """The conversations through one running app, which is deleted after them."""
    name, path, config = app
    direct = config["direct_dispatch"]
    try:
        base = f"http://127.0.0.1:{port}{path}"
        if direct:  # both replicas found on the board before the conversations start
            assert wait_until(lambda: _direct_sent(base) >= 2, timeout_s=60), admin_state(base)
        rows = run_conversations(base, [ALICE, BOB], MODEL, CONVERSATIONS, TURNS, seed=1, tag=path[1:])
        _add_replicas(base, rows)
        if direct:
            rows.append({"turn": -1, "direct_sent": _direct_sent(base), "streamed": _streamed(base)})
        return rows
    finally:
        serve.delete(name)


def _add_replicas(base: str, rows: list[dict]) -> None:
    """Each turn's replica, from the router's timing records (before the app is deleted): a failed
    comparison then shows where the baseline's turns went."""
    records = httpx.get(f"{base}/admin/timings", headers=ADMIN, timeout=30).json()["records"]
    replica_of = {r["request_id"]: r["replica_id"] for r in records}
    for row in rows:
        row["replica"] = replica_of.get(row["id"].split("-", 1)[-1], "?")


def _direct_sent(base: str) -> int:
    """Requests the router sent directly; each call first sends one (a warm-up that also shows
    whether the replicas are known yet)."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=ALICE, max_retries=0, timeout=120)
    client.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
    return admin_state(base)["direct_dispatch"][MODEL]


def _streamed(base: str) -> str:
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=BOB, max_retries=0, timeout=120)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to five."}], max_tokens=24, stream=True
    )
    return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)


@pytest.fixture(scope="module")
def runs(ray_serve: int, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """The three runs one after another, each app deployed while the one before it runs its
    conversations: its replicas start beside that run instead of after it (at most two apps, four
    engine replicas, at once)."""
    tenancy = write_tenancy(tmp_path_factory.mktemp("choice") / "tenants.yaml")
    apps = {"load": _app("load", tenancy), "prefix": _app("prefix", tenancy)}
    apps["direct"] = _app("prefix", tenancy, direct=True)
    order = list(apps)
    runs: dict[str, list[dict]] = {}
    try:
        deploy_apps([apps[order[0]]])
        for kind, following in zip(order, [*order[1:], None], strict=True):
            wait_running([apps[kind][0]])
            if following is not None:
                deploy_apps([apps[following]])
            runs[kind] = _run(apps[kind], ray_serve)
        return runs
    finally:  # what a failed start or run left (each run deletes its own app when it is done)
        running = serve.status().applications
        for name, _, _ in apps.values():
            if name in running:
                serve.delete(name)


def test_prefix_choice_sends_every_later_turn_to_the_replica_holding_its_history(runs) -> None:
    later = [r for r in runs["prefix"] if r["turn"] > 0]
    assert len(later) == CONVERSATIONS * (TURNS - 1)
    for row in later:  # at least the system prompt's whole blocks, found where turn 1 went
        assert row["cached_tokens"] >= row["prompt_tokens"] // 2, row
    # ... because each conversation stayed on one replica (the router's own records say which)
    where = {(r["conversation"], r["turn"]): r["replica"] for r in runs["prefix"]}
    assert "?" not in where.values(), where
    assert all(where[(c, t)] == where[(c, 0)] for c, t in where), where


def test_prefix_choice_hits_more_than_load_alone(runs) -> None:
    load, prefix = summarize(runs["load"]), summarize(runs["prefix"])
    where = [(r["conversation"], r["turn"], r["replica"]) for r in runs["load"]]  # for a failure's message
    assert prefix["later_hit_rate"] > load["later_hit_rate"] + 0.1, (load, prefix, where)
    assert load["later_turns_without_hit"] > 0, load  # by load alone some turns miss their replica
    assert prefix["later_turns_without_hit"] == 0, prefix


def test_direct_dispatch_makes_the_same_choice_past_serves_handle(runs) -> None:
    *rows, totals = runs["direct"]
    later = [r for r in rows if r["turn"] > 0]
    assert len(later) == CONVERSATIONS * (TURNS - 1)
    for row in later:
        assert row["cached_tokens"] >= row["prompt_tokens"] // 2, row
    # every conversation turn and the warm-ups after discovery went directly
    assert totals["direct_sent"] >= CONVERSATIONS * TURNS + 3, totals
    assert len(totals["streamed"]) > 0
