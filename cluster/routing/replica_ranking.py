"""Which replica gets a request: the cost of sending it there, by load alone or by load and cached prefix.

Pure (no Ray): ``cluster.routing.kv_router.KVAwareRouter`` feeds it Serve's view of the replicas, and
the simulator (``loadtest/sim``) feeds it simulated ones.

A request's cost on replica r, in prompt tokens the replica must compute before the request's
first token (docs/cluster.md, "Replica choice"):

    cost(r) = queued(r) + per_request · ongoing(r) + (prompt − hit(r))

* ``queued(r)``: the tokens of requests waiting on r (its last report; none when no request is
  ongoing there, the report being older than their end) plus what this router sent it since that
  report (``unreported``: each request's uncached prompt tokens and answer budget), so requests
  chosen in one tick see each other.
* ``ongoing(r)``: requests on r (Serve's queue-length cache), ``per_request`` tokens each.
* ``hit(r)``: prompt tokens r holds in its prefix cache (choice ``prefix``; 0 for ``load``): the
  leading blocks its summary or this router's recent sends to it say it has.
* a request for a LoRA adapter that r does not hold in its device slots costs ``ADAPTER_MISS_TOKENS``
  more there (r must read it in, and may evict another): a hot adapter stays where it is resident
  until that replica's queue outweighs the load elsewhere, then spreads to a second replica.

Ties go to the replica with more free KV (net of queued tokens). With ``load`` the prompt term is the
same everywhere, so the order is queued tokens then free KV, as before the prefix choice existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ReplicaChoice = Literal["load", "prefix"]
PER_REQUEST_TOKENS = 16
ADAPTER_MISS_TOKENS = 256


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One replica as a router sees it when choosing."""

    waiting_tokens: float = 0.0  # reported: uncached prompt + answer budget of requests not producing
    unreported_tokens: float = 0.0  # sent by this router since that report
    ongoing: int = 0  # requests on the replica (Serve's queue-length cache)
    kv_free_tokens: float = 0.0
    hit_tokens: int = 0
    adapter_missing: bool = False  # the request names an adapter this replica does not hold


def replica_cost(
    state: ReplicaState, prompt_tokens: int, per_request: int = PER_REQUEST_TOKENS
) -> tuple[float, float]:
    """Lower is better: (prefill work ahead of the request and its own, then negated free KV).

    A replica with no request ongoing has none waiting: a report that still counts some predates
    their end (reports are up to a stats period old), and would make the holder of a prompt's prefix
    look busier than an idle replica that must compute it all."""
    reported = state.waiting_tokens if state.ongoing > 0 else 0.0
    queued = reported + state.unreported_tokens
    miss = max(0, prompt_tokens - state.hit_tokens)
    load = ADAPTER_MISS_TOKENS if state.adapter_missing else 0
    return (queued + per_request * state.ongoing + miss + load, -(state.kv_free_tokens - queued))


def replica_score(stats: dict, queue_len: int | None, block_tokens: int = 16) -> tuple[float, float]:
    """The load-only cost from a replica's routing stats (``record_routing_stats``) and its queue
    length, with nothing unreported: what the simulator's ``fairlane`` choice ranks by."""
    state = ReplicaState(
        waiting_tokens=float(stats.get("waiting_tokens", 0)),
        ongoing=int(queue_len or 0),
        kv_free_tokens=float(stats.get("kv_blocks_free", 0)) * block_tokens,
    )
    return replica_cost(state, 0, block_tokens)
