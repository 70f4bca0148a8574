"""A Ray Serve ``RequestRouter`` that prefers the replica with the most free KV cache.

Replicas publish ``record_routing_stats`` (free KV blocks, waiting requests and the tokens those
requests still need); Serve refreshes them every ``request_routing_stats_period_s``. Between
refreshes the router's own count of requests it sent (``on_send_request`` updates Serve's queue
length cache) breaks ties, so a burst does not all land on the replica that looked emptiest.
Each replica is returned as its own rank, best first; Serve takes the first rank with room.
"""

from __future__ import annotations

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica


def replica_score(stats: dict, queue_len: int | None, block_tokens: int = 16) -> tuple[float, float]:
    """Lower is better: tokens still queued first, then (negated) free KV tokens net of queued work."""
    waiting_tokens = float(stats.get("waiting_tokens", 0))
    free_tokens = float(stats.get("kv_blocks_free", 0)) * block_tokens
    pending = float(queue_len or 0)
    return (waiting_tokens + pending * block_tokens, -(free_tokens - waiting_tokens))


class KVAwareRouter(FIFOMixin, RequestRouter):
    """Most free KV / fewest queued tokens first; Serve's queue-length probe is the final check."""

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        cache = self.replica_queue_len_cache

        def key(replica: RunningReplica) -> tuple[float, float]:
            return replica_score(replica.routing_stats or {}, cache.get(replica.replica_id))

        return [[replica] for replica in sorted(candidate_replicas, key=key)]
