"""KVAwareRouter's choice, fed fake replicas: a burst spreads, a cached prefix attracts its
conversation until the queue there costs more than the prefill it saves, and scopes stay apart."""

from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from uuid import uuid4

import pytest

from cluster.routing.kv_router import KVAwareRouter
from cluster.routing.replica_ranking import ReplicaState, replica_cost, replica_score
from cluster.serving.wire import GenerateArgs
from replica.cache_summary import build_summary
from replica.prefix_cache import chain_root, extend_chain

MODEL_KEY = "smollm2-135m|False|0"
SYSTEM = list(range(1000, 1000 + 480))  # 30 blocks of 16


@dataclass(frozen=True)
class _Id:
    unique_id: str


@dataclass
class _Replica:
    name: str
    routing_stats: dict = field(default_factory=dict)

    @property
    def replica_id(self) -> _Id:
        return _Id(self.name)


class _QueueLens:
    """Serve's queue-length cache: requests ongoing per replica (none unless a test says)."""

    def __init__(self, ongoing: dict[str, int] | None = None) -> None:
        self._ongoing = ongoing or {}

    def get(self, replica_id):
        return self._ongoing.get(replica_id.unique_id)


def _new_id() -> str:
    return uuid4().hex


@dataclass
class _Pending:
    args: list
    metadata: SimpleNamespace = field(
        default_factory=lambda: SimpleNamespace(internal_request_id=uuid4().hex)
    )


def _router(choice: str, ongoing: dict[str, int] | None = None) -> KVAwareRouter:
    router = KVAwareRouter.__new__(KVAwareRouter)  # Serve's constructor needs a live deployment
    router._replica_queue_len_cache = _QueueLens(ongoing)
    router.initialize_state(replica_choice=choice)
    return router


def _request(rid: str, prompt: list[int], tenant: str = "alice", max_tokens: int = 16) -> _Pending:
    return _Pending([GenerateArgs(rid, prompt, {"max_tokens": max_tokens}, tenant=tenant)])


def _summary_holding(prompt: list[int], tenant: str = "alice") -> dict:
    scope = GenerateArgs("x", [], tenant=tenant).cache_scope()
    keys: list[bytes] = []
    extend_chain(keys, chain_root(MODEL_KEY, scope), prompt, 16, len(prompt) // 16)
    return build_summary(keys, MODEL_KEY, 16).as_dict()


def _stats(waiting_tokens: int = 0, summary: dict | None = None) -> dict:
    return {
        "kv_blocks_free": 1000,
        "waiting_tokens": waiting_tokens,
        "reported_at": 0.0,
        "prefix_summary": summary or build_summary([], MODEL_KEY, 16).as_dict(),
    }


def _first(router: KVAwareRouter, replicas: list[_Replica], pending: _Pending) -> str:
    ranks = asyncio.run(router.choose_replicas(replicas, pending))
    return ranks[0][0].name


@pytest.mark.parametrize("choice", ["load", "prefix"])
def test_a_burst_chosen_in_one_tick_spreads_over_idle_replicas(choice: str):
    router = _router(choice)
    replicas = [_Replica(f"r{i}", _stats()) for i in range(4)]
    firsts = [
        _first(router, replicas, _request(f"q{i}", list(range(i * 100, i * 100 + 40)))) for i in range(8)
    ]
    assert sorted(firsts.count(r.name) for r in replicas) == [2, 2, 2, 2]


def test_a_conversations_next_turn_goes_to_the_replica_holding_its_prefix():
    turn_two = SYSTEM + list(range(50, 90))
    holder = _Replica("holder", _stats(waiting_tokens=200, summary=_summary_holding(SYSTEM)))
    idle = [_Replica(f"idle{i}", _stats()) for i in range(3)]
    assert _first(_router("prefix"), [*idle, holder], _request("t2", turn_two)) == "holder"
    assert _first(_router("load"), [*idle, holder], _request("t2", turn_two)) != "holder"


def test_a_queue_longer_than_the_saved_prefill_outweighs_the_prefix():
    turn_two = SYSTEM + list(range(50, 90))
    holder = _Replica("holder", _stats(waiting_tokens=2000, summary=_summary_holding(SYSTEM)))
    idle = _Replica("idle", _stats())
    assert _first(_router("prefix", {"holder": 8}), [holder, idle], _request("t2", turn_two)) == "idle"


def test_a_report_older_than_the_end_of_its_requests_weighs_nothing():
    """The holder reported a queue, but nothing is ongoing there any more (Serve's queue length):
    that queue has ended, and the prefix decides."""
    turn_two = SYSTEM + list(range(50, 90))
    holder = _Replica("holder", _stats(waiting_tokens=2000, summary=_summary_holding(SYSTEM)))
    idle = _Replica("idle", _stats())
    assert _first(_router("prefix", {"holder": 0}), [holder, idle], _request("t2", turn_two)) == "holder"


def test_another_tenants_cached_prompt_attracts_nothing():
    holder = _Replica("holder", _stats(waiting_tokens=200, summary=_summary_holding(SYSTEM, tenant="bob")))
    idle = _Replica("idle", _stats())
    request = _request("t", [*SYSTEM, 1, 2, 3], tenant="alice")
    assert _first(_router("prefix", {"holder": 2}), [holder, idle], request) == "idle"


def test_requests_sent_since_the_last_report_weigh_on_their_replica_until_a_newer_report():
    router = _router("load")
    a, b = _Replica("a", _stats()), _Replica("b", _stats(waiting_tokens=100))
    assert _first(router, [a, b], _request("q1", list(range(300)))) == "a"  # a now carries 316 tokens
    assert _first(router, [a, b], _request("q2", list(range(10)))) == "b"
    a.routing_stats = {**_stats(), "reported_at": 1e12}  # a report made after both sends
    b.routing_stats = {**_stats(waiting_tokens=100), "reported_at": 1e12}
    assert _first(router, [a, b], _request("q3", list(range(10)))) == "a"


def test_serve_sending_elsewhere_moves_the_optimistic_count():
    router = _router("load")
    a, b = _Replica("a", _stats()), _Replica("b", _stats(waiting_tokens=50))
    pending = _request("q1", list(range(300)))
    assert _first(router, [a, b], pending) == "a"
    router.on_request_routed(pending, _Id("b"), None)  # a was full: Serve took the next rank
    assert _first(router, [a, b], _request("q2", list(range(10)))) == "a"


def test_the_load_cost_keeps_the_old_ranking():
    assert replica_score({"waiting_tokens": 32, "kv_blocks_free": 10}, 2) == (64.0, -(160.0 - 32.0))
    cached = replica_cost(ReplicaState(waiting_tokens=100, hit_tokens=480), 520)
    cold = replica_cost(ReplicaState(waiting_tokens=0), 520)
    assert cached < cold  # 100 + 40 beats 0 + 520


def test_an_unknown_choice_is_refused():
    with pytest.raises(ValueError, match="load or prefix"):
        _router("random")


def test_the_config_switch_reaches_the_request_router():
    from cluster.app import replica_options
    from cluster.config import AppConfig

    assert AppConfig().replica_choice == "prefix"
    for choice in ("load", "prefix"):
        opts = replica_options(AppConfig(replica_choice=choice))
        assert opts["request_router_config"].request_router_kwargs == {"replica_choice": choice}


def test_serve_refuses_an_unknown_replica_choice():
    from typer.testing import CliRunner

    from fairlane import cli

    result = CliRunner().invoke(cli.app, ["serve", "--replica-choice", "random"])
    assert result.exit_code == 2
    assert "load or prefix" in result.output


async def test_a_router_hashes_a_prompt_as_the_engine_registered_it(engine) -> None:
    """The summary of a real engine, read the router's way: the prompt's blocks under its own scope are
    found, under another tenant's they are not (the router and the engine hash alike)."""
    from cluster.routing.prefix_affinity import PrefixAffinity, Prompt
    from replica import SamplingParams

    alice = GenerateArgs("x", [], tenant="alice").cache_scope()
    bob = GenerateArgs("x", [], tenant="bob").cache_scope()
    prompt = list(range(300, 400))  # 6 full blocks and 4 tokens
    async for _ in engine.generate(prompt, SamplingParams(max_tokens=2, temperature=0), cache_scope=alice):
        pass
    affinity = PrefixAffinity()
    affinity.update("r", engine.cache_summary().as_dict())
    assert affinity.hit_blocks("r", affinity.chain(Prompt("next-turn", [*prompt, 7, 8, 9], alice))) >= 6
    assert affinity.hit_blocks("r", affinity.chain(Prompt("bob", [*prompt, 7, 8, 9], bob))) == 0
    assert affinity.hit_blocks("r", affinity.chain(Prompt("other", list(range(500, 600)), alice))) == 0


def test_where_serve_sent_a_request_is_remembered_as_holding_its_prefix():
    router = _router("prefix")
    empty = build_summary([], MODEL_KEY, 16).as_dict()
    a, b = _Replica("a", _stats(summary=empty)), _Replica("b", _stats(waiting_tokens=50, summary=empty))
    first = _request("t1", SYSTEM)
    assert _first(router, [a, b], first) == "a"
    router.on_request_routed(first, _Id("b"), None)  # a was full: b computes, and will hold, the prompt
    a.routing_stats = b.routing_stats = {**_stats(summary=empty), "reported_at": 1e12}  # both idle again
    assert _first(router, [a, b], _request("t2", [*SYSTEM, 1, 2, 3])) == "b"


def test_sends_before_any_summary_are_hashed_when_the_first_one_arrives():
    """A router's first requests go out before any replica reported how it hashes (no summary yet):
    the conversation's next turn still goes where its first turn went, not by load alone."""
    router = _router("prefix")
    unreported = {"prefix_summary": None}
    a, b = _Replica("a", _stats() | unreported), _Replica("b", _stats(waiting_tokens=50) | unreported)
    assert _first(router, [a, b], _request("t1", SYSTEM)) == "a"
    empty = build_summary([], MODEL_KEY, 16).as_dict()  # reports arrive; a's does not show t1's blocks yet
    a.routing_stats = {**_stats(waiting_tokens=40, summary=empty), "reported_at": 1e12}
    b.routing_stats = {**_stats(summary=empty), "reported_at": 1e12}
    assert _first(router, [a, b], _request("t2", [*SYSTEM, 1, 2, 3])) == "a"  # its prefix beats b's load


def test_requests_that_ended_since_a_report_are_not_waiting_any_more():
    """The holder's report still counts the first turn as waiting, but it ended since:
    its tokens come off the report, and the second turn goes to its prefix."""
    from cluster.routing import request_ends

    router = _router("prefix", {"holder": 1, "idle": 1})
    empty = build_summary([], MODEL_KEY, 16).as_dict()
    holder = _Replica("holder", _stats(summary=empty))
    idle = _Replica("idle", _stats(waiting_tokens=300, summary=empty))
    first = _request("t1", SYSTEM)
    assert _first(router, [holder, idle], first) == "holder"
    router.on_request_routed(first, _Id("holder"), None)
    time.sleep(0.01)
    report = time.time()  # made after t1 was sent, while it still waited
    stale = {
        **_stats(waiting_tokens=len(SYSTEM) + 16, summary=_summary_holding(SYSTEM)),
        "reported_at": report,
    }
    holder.routing_stats, idle.routing_stats = stale, {**_stats(summary=empty), "reported_at": report}
    second = _request("t2", [*SYSTEM, 1, 2, 3])
    assert _first(copy.deepcopy(router), [holder, idle], second) == "idle"  # the stale report outweighs it
    time.sleep(0.01)
    request_ends.record("holder", "t1")  # the router saw it end (request_flow), after the report
    assert _first(router, [holder, idle], second) == "holder"
