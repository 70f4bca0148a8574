"""Replica choice through real Ray Serve, two replicas of the embedded default: with ``prefix`` a
conversation's later turns reach the replica that holds its history (every one finds it cached);
with ``load`` they land by load alone and find less (issue 25)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ray import serve

from bench.prefix_routing import run_conversations, summarize
from tests.cluster.helpers import ALICE, BOB, MODEL, start_app, write_tenancy

CONVERSATIONS, TURNS = 4, 3


def _run(choice: str, port: int, tenancy: Path) -> list[dict]:
    name = f"fl-choice-{choice}"
    config = {
        "engine": {"device": "cpu", "kv_cache_tokens": 16384, "max_num_seqs": 16},
        "tenancy_config": str(tenancy),
        "num_replicas": 2,
        "replica_room": 4,
        "replica_choice": choice,
        "queue_timeout_s": 600.0,
    }
    start_app(name, f"/{choice}", config)
    try:
        base = f"http://127.0.0.1:{port}/{choice}"
        return run_conversations(base, [ALICE, BOB], MODEL, CONVERSATIONS, TURNS, seed=1, tag=choice)
    finally:
        serve.delete(name)


@pytest.fixture(scope="module")
def runs(ray_serve: int, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    tenancy = write_tenancy(tmp_path_factory.mktemp("choice") / "tenants.yaml")
    return {choice: _run(choice, ray_serve, tenancy) for choice in ("load", "prefix")}


def test_prefix_choice_sends_every_later_turn_to_the_replica_holding_its_history(runs) -> None:
    later = [r for r in runs["prefix"] if r["turn"] > 0]
    assert len(later) == CONVERSATIONS * (TURNS - 1)
    for row in later:  # at least the system prompt's whole blocks, found where turn 1 went
        assert row["cached_tokens"] >= row["prompt_tokens"] // 2, row


def test_prefix_choice_hits_more_than_load_alone(runs) -> None:
    load, prefix = summarize(runs["load"]), summarize(runs["prefix"])
    assert prefix["later_hit_rate"] > load["later_hit_rate"] + 0.1, (load, prefix)
    assert load["later_turns_without_hit"] > 0, load  # by load alone some turns miss their replica
    assert prefix["later_turns_without_hit"] == 0, prefix
