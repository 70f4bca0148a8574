"""A Ray Serve ``RequestRouter`` that ranks replicas by the cost of a request on each (replica_ranking).

Replicas publish ``record_routing_stats`` (free KV blocks, waiting requests and the tokens those
requests still need, and a summary of their prefix cache); Serve refreshes them every
``request_routing_stats_period_s``. The choice (``replica_choice``, Serve's
``request_router_kwargs``) is ``prefix`` (default: a replica that holds the request's prompt
prefix saves that prefill) or ``load`` (load alone). Each choice adds its request to the chosen
replica at once (``SentSinceReport``), so a burst ranked in one tick spreads by load. Each replica
is returned as its own rank, best first; Serve takes the first rank with room.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from cluster.routing import request_ends
from cluster.routing.live_replicas import publish
from cluster.routing.prefix_affinity import PrefixAffinity, Prompt
from cluster.routing.replica_ranking import ReplicaChoice, ReplicaState, replica_cost, replica_score
from cluster.routing.sent_since_report import SentSinceReport

__all__ = ["KVAwareRouter", "replica_score"]


class KVAwareRouter(FIFOMixin, RequestRouter):
    """Lowest cost first: queued tokens, then the prompt tokens a replica's cache does not hold."""

    def initialize_state(self, replica_choice: ReplicaChoice = "prefix", **kwargs: Any) -> None:
        if replica_choice not in ("load", "prefix"):
            raise ValueError(f"replica_choice must be load or prefix, not {replica_choice!r}")
        self._choice = replica_choice
        self._affinity = PrefixAffinity()
        self._sent = SentSinceReport()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not hasattr(self, "_choice"):  # Serve calls initialize_state; a bare instance may not
            self.initialize_state()
        prompt = _prompt_of(pending_request)
        for replica in candidate_replicas:  # what ended there since: its report may still count it
            rid = replica.replica_id.unique_id
            for request_id, at in request_ends.take(rid):
                self._sent.ended(rid, request_id, at)
        chain: list[bytes] = []
        if prompt is not None and self._choice == "prefix":
            for replica in candidate_replicas:
                stats = replica.routing_stats or {}
                self._affinity.update(replica.replica_id.unique_id, stats.get("prefix_summary"))
            chain = self._affinity.chain(prompt)
        block_size = self._affinity.block_size()
        prompt_tokens = len(prompt.token_ids) if prompt is not None else 0
        cache = self.replica_queue_len_cache
        adapter = getattr(_args(pending_request), "adapter", None)

        def cost(replica: RunningReplica) -> tuple[float, float]:
            stats = replica.routing_stats or {}
            rid = replica.replica_id.unique_id
            waiting = float(stats.get("waiting_tokens", 0))
            state = ReplicaState(
                waiting_tokens=self._sent.reported_waiting(rid, waiting, stats.get("reported_at")),
                unreported_tokens=self._sent.tokens(rid, stats.get("reported_at")),
                ongoing=int(cache.get(replica.replica_id) or 0),
                kv_free_tokens=float(stats.get("kv_blocks_free", 0)) * block_size,
                hit_tokens=self._affinity.hit_blocks(rid, chain) * block_size if chain else 0,
                adapter_missing=adapter is not None and adapter not in stats.get("adapters", ()),
            )
            return replica_cost(state, prompt_tokens)

        ranked = sorted(candidate_replicas, key=cost)
        if prompt is not None and ranked:
            first = ranked[0].replica_id.unique_id
            # The work it adds there: the prompt tokens that replica's cache lacks, and the answer.
            hit = self._affinity.hit_blocks(first, chain) * block_size if chain else 0
            self._sent.chose(prompt.request_id, first, _pending_tokens(pending_request) - hit)
            if self._choice == "prefix":
                self._affinity.remember_send(first, prompt, chain)
        return [[replica] for replica in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id, result) -> None:
        """Serve sent the request: where it went counts its tokens and will hold its prefix (the
        first rank may have been full: what this router remembered there moves)."""
        prompt = _prompt_of(pending_request)
        if prompt is None or not hasattr(self, "_sent"):
            return
        chosen, sent = self._sent.replica_of(prompt.request_id), replica_id.unique_id
        self._sent.routed(prompt.request_id, sent)
        if self._choice == "prefix" and chosen is not None and chosen != sent:
            chain = self._affinity.chain(prompt)
            self._affinity.forget(chosen, chain)
            self._affinity.remember(sent, chain)
            self._affinity.moved(prompt.request_id, sent)

    def update_replicas(self, replicas):  # Serve's hook: forget what is known of replicas gone
        out = super().update_replicas(replicas)
        live = frozenset(r.replica_id.unique_id for r in replicas)
        deployment = getattr(self, "_deployment_id", None)
        if deployment is not None:  # for the dispatcher: requests on a stopping replica free room
            publish(deployment.app_name, deployment.name, live)
        if hasattr(self, "_affinity"):
            self._affinity.keep_only(live)
            self._sent.forget_replicas(live)
            request_ends.forget(set(live))
        return out


def _args(pending_request: PendingRequest | None) -> Any:
    if pending_request is None or not pending_request.args:
        return None
    return pending_request.args[0]


def _prompt_of(pending_request: PendingRequest | None) -> Prompt | None:
    """The generation's prompt (``GenerateArgs``), or None for other calls (``info``, ``profile``)."""
    args = _args(pending_request)
    token_ids = getattr(args, "prompt_ids", None)
    if token_ids is None or not hasattr(args, "cache_scope"):
        return None
    return Prompt(args.request_id, token_ids, args.cache_scope())


def _pending_tokens(pending_request: PendingRequest | None) -> float:
    """What the replica will count in its waiting tokens for the request: prompt + max tokens × n."""
    args = _args(pending_request)
    sampling = getattr(args, "sampling", {}) or {}
    return len(args.prompt_ids) + int(sampling.get("max_tokens", 16)) * int(sampling.get("n", 1))
