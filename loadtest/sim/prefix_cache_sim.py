"""The prefix cache in the simulator: each replica keeps an LRU of block keys as large as its KV cache.

A request carries its block chain (``ChatChains``: the keys of its prompt's full blocks and of its
prompt + answer's). At submission the replica looks up the longest run of leading keys it holds,
short of the prompt's last token (as ``Scheduler._lookup``), and those tokens are not prefilled
(``Job.cached``). The prompt's full blocks are registered when its prefill phase ends (the engine
registers a block after the step that wrote it), the answer's when the request finishes (the next
turn of a conversation finds it). Capacity is the replica's KV blocks (``ReplicaSpec.kv_blocks``),
least recently used evicted first.

Simplifications (docs/simulator.md, "Prefix cache"): the LRU holds at most ``kv_blocks`` keys beside
the blocks running requests reserve (the engine shares them: a held block is cached and in use at
once), so the modelled cache is at most twice as roomy as the engine's under a full batch; a hit is
decided at submission, not at admission.

``PrefixChoice`` ranks replicas with the router's own cost (``cluster.routing.replica_ranking``):
the replicas' stats and cache contents as of the last report (every ``routing_stats_period_s``),
the router's sends since that report, and its sends of the last ``RECENT_S`` seconds as held.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from cluster.routing.prefix_affinity import RECENT_S
from cluster.routing.replica_ranking import ReplicaState, replica_cost
from loadtest.sim.replica import Job, SimReplica


@dataclass(frozen=True, slots=True)
class ChatChains:
    """A request's block keys: ``lookup`` (full prompt blocks short of its last token), ``prompt``
    (every full prompt block) and ``full`` (full blocks of prompt + answer)."""

    lookup: tuple[int, ...]
    prompt: tuple[int, ...]
    full: tuple[int, ...]


class BlockLRU:
    """Block keys, least recently used first, each with the time it was first registered."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[int, float] = OrderedDict()
        self.evictions = 0

    def leading(self, chain: Sequence[int], as_of: float | None = None) -> int:
        """Leading keys of ``chain`` held (registered by ``as_of``, when given: a report's view)."""
        count = 0
        for key in chain:
            at = self._keys.get(key)
            if at is None or (as_of is not None and at > as_of):
                break
            count += 1
        return count

    def touch(self, chain: Sequence[int], now: float) -> None:
        """Register ``chain`` (or refresh its recency), evicting the least recently used beyond capacity."""
        keys = self._keys
        for key in chain:
            if key in keys:
                keys.move_to_end(key)
            else:
                keys[key] = now
        while len(keys) > self.capacity:
            keys.popitem(last=False)
            self.evictions += 1


class CachingReplica(SimReplica):
    """A ``SimReplica`` with a prefix cache (``submit_chat`` instead of ``submit``)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.cache = BlockLRU(self.spec.kv_blocks)
        self.chains: dict[int, ChatChains] = {}
        self.prompt_tokens = 0
        self.cached_tokens = 0

    def submit_chat(self, job: Job, chains: ChatChains) -> None:
        found = self.cache.leading(chains.lookup)
        self.cache.touch(chains.lookup[:found], self.loop.now)
        job.cached = found * self.spec.block_size
        self.chains[job.rid] = chains
        self.prompt_tokens += job.prompt
        self.cached_tokens += job.cached
        self.submit(job)

    def _on_phase_end(self, version: int) -> None:
        phase = self.phase if version == self.version else None
        super()._on_phase_end(version)
        for job in phase.jobs if phase is not None else ():
            self.cache.touch(self.chains[job.rid].prompt, self.loop.now)

    def _pop_finished(self, step: int) -> list[Job]:
        done = super()._pop_finished(step)
        for job in done:
            self.cache.touch(self.chains.pop(job.rid).full, self.loop.now)
        return done


class PrefixChoice:
    """The router's ranking (``replica_choice`` load or prefix) over simulated replicas."""

    def __init__(self, mode: str, recent_keys: int = 16_384) -> None:
        if mode not in ("load", "prefix"):
            raise ValueError(f"replica choice is load or prefix, not {mode!r}")
        self.mode = mode
        self._stats: dict[int, tuple[float, float]] = {}  # index -> (waiting tokens, free KV tokens)
        self._reported_at = float("-inf")
        self._unreported: dict[int, float] = {}
        self._recent: dict[int, OrderedDict[int, float]] = {}
        self._recent_keys = recent_keys

    def refresh(self, replicas: Sequence[CachingReplica], now: float) -> None:
        """The replicas reported (stats and cache summaries as of ``now``)."""
        self._stats = {r.index: (r.waiting_tokens, r.free_blocks * r.spec.block_size) for r in replicas}
        self._reported_at = now
        self._unreported = {}

    def choose(
        self, replicas: Sequence[CachingReplica], job: Job, chains: ChatChains, room: int, now: float
    ) -> CachingReplica | None:
        best, best_cost, best_hit = None, None, 0
        for r in replicas:
            if r.ongoing >= room:
                continue
            waiting, free = self._stats.get(r.index, (0.0, 0.0))
            hit = self._hit_blocks(r, chains.lookup, now) * r.spec.block_size if self.mode == "prefix" else 0
            state = ReplicaState(waiting, self._unreported.get(r.index, 0.0), r.ongoing, free, hit)
            cost = replica_cost(state, job.prompt)
            if best_cost is None or cost < best_cost:
                best, best_cost, best_hit = r, cost, hit
        if best is not None:
            # As the router: the prompt tokens the chosen replica's cache lacks (the sim's replicas
            # report waiting prompt tokens, no answer budget).
            self._unreported[best.index] = self._unreported.get(best.index, 0.0) + job.prompt - best_hit
            if self.mode == "prefix":
                self._remember(best.index, chains.lookup, now)
        return best

    def _hit_blocks(self, r: CachingReplica, chain: Sequence[int], now: float) -> int:
        reported = r.cache.leading(chain, as_of=self._reported_at)
        recent = self._recent.get(r.index)
        if not recent:
            return reported
        count = 0
        for key in chain:
            at = recent.get(key)
            if at is None or at < now - RECENT_S:
                break
            count += 1
        return max(reported, count)

    def _remember(self, index: int, chain: Sequence[int], now: float) -> None:
        recent = self._recent.setdefault(index, OrderedDict())
        for key in chain:
            recent[key] = now
            recent.move_to_end(key)
        while len(recent) > self._recent_keys:
            recent.popitem(last=False)
