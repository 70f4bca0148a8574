"""What a router knows of each replica's prefix cache, and of the requests it sent since each report.

Two sources say how many leading blocks of a prompt a replica holds:

* its **summary** (``replica/cache_summary.py``), a Bloom filter of its registered block keys that
  arrives with its routing stats every 0.5 s: the truth, half a second late;
* this router's **recent sends**: the chains of the prompts it sent to the replica in the last
  ``RECENT_S`` seconds. A burst of one tenant's requests (one system prompt) arrives within one
  report period; without this the burst would spread before any report showed the prefix.

Sends made before any replica reported a summary (a router's first requests) cannot be hashed yet:
the chain's root needs the replica's model key. They are kept by prompt and hashed, with the time
they were sent, when the first summary arrives, so a conversation's second turn still finds where
its first went.

The prompt's chain is hashed exactly as the engine hashes it (``replica/prefix_cache.py``: the
same root, from the replica's model key and the request's cache scope, and the same blocks), so a
request can only match blocks of its own scope. Pure: no Ray (the simulator uses it too).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from replica.cache_summary import CacheSummary, SummaryReader
from replica.prefix_cache import chain_root, extend_chain

RECENT_S = 10.0  # a send counts this long: by then a report shows what the replica registered
RECENT_KEYS = 16_384  # per replica: enough for ~100 long conversations sent within RECENT_S
CHAINS = 1024  # requests whose chain is kept (a request is ranked again while all replicas are full)


@dataclass(frozen=True, slots=True)
class Prompt:
    """What the choice needs of a request: its id, token ids and cache scope."""

    request_id: str
    token_ids: list[int]
    scope: str


@dataclass(slots=True)
class _ReplicaCache:
    summary_dict: dict | None = None  # the received dict, kept so a new report is seen by identity
    reader: SummaryReader | None = None
    recent: OrderedDict[bytes, float] = field(default_factory=OrderedDict)


class PrefixAffinity:
    """Per replica: its summary and this router's recent sends; per request: its chain."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._replicas: dict[str, _ReplicaCache] = {}
        self._chains: OrderedDict[tuple[str, str], list[bytes]] = OrderedDict()
        # request id -> (replica id, prompt, sent at): sends not hashed yet (no summary seen)
        self._unhashed: OrderedDict[str, tuple[str, Prompt, float]] = OrderedDict()

    def update(self, replica_id: str, summary: dict | None) -> None:
        """The replica's latest routing stats carried ``summary`` (unpacked once per report)."""
        cache = self._replicas.setdefault(replica_id, _ReplicaCache())
        if summary is not cache.summary_dict:
            cache.summary_dict = summary
            cache.reader = None if summary is None else SummaryReader(CacheSummary.from_dict(summary))
        if cache.reader is not None and self._unhashed:
            self._hash_early_sends()

    def keep_only(self, replica_ids: set[str]) -> None:
        for gone in set(self._replicas) - replica_ids:
            del self._replicas[gone]

    def chain(self, prompt: Prompt) -> list[bytes]:
        """The prompt's block keys as the engine computes them; [] while no replica reported how."""
        reader = next((c.reader for c in self._replicas.values() if c.reader is not None), None)
        if reader is None:
            return []
        summary = reader.summary
        key = (prompt.request_id, summary.model_key)
        found = self._chains.get(key)
        if found is None:
            # Only blocks short of the last token count: the engine computes that one (and the
            # block it ends) whatever it finds.
            blocks = max(0, len(prompt.token_ids) - 1) // summary.block_size
            found = []
            root = chain_root(summary.model_key, prompt.scope)
            extend_chain(found, root, prompt.token_ids, summary.block_size, blocks)
            self._chains[key] = found
            while len(self._chains) > CHAINS:
                self._chains.popitem(last=False)
        return found

    def block_size(self) -> int:
        reader = next((c.reader for c in self._replicas.values() if c.reader is not None), None)
        return reader.summary.block_size if reader is not None else 16

    def hit_blocks(self, replica_id: str, chain: list[bytes]) -> int:
        """Leading blocks of ``chain`` the replica holds, by its summary or a recent send to it."""
        cache = self._replicas.get(replica_id)
        if cache is None or not chain:
            return 0
        reported = cache.reader.leading_blocks(chain) if cache.reader is not None else 0
        return max(reported, self._recent_blocks(cache, chain))

    def remember(self, replica_id: str, chain: list[bytes], at: float | None = None) -> None:
        """The router sent a request with ``chain`` to the replica (at ``at``, default now)."""
        if not chain:
            return
        recent = self._replicas.setdefault(replica_id, _ReplicaCache()).recent
        now = self._clock() if at is None else at
        for key in chain:
            recent[key] = now
            recent.move_to_end(key)
        while len(recent) > RECENT_KEYS:
            recent.popitem(last=False)

    def remember_send(self, replica_id: str, prompt: Prompt, chain: list[bytes]) -> None:
        """The router sent ``prompt`` (whose chain is ``chain``) to the replica; with no summary seen
        yet the chain is [] and the prompt waits to be hashed."""
        if chain:
            self.remember(replica_id, chain)
        elif not any(c.reader is not None for c in self._replicas.values()):
            self._unhashed[prompt.request_id] = (replica_id, prompt, self._clock())
            while len(self._unhashed) > CHAINS:
                self._unhashed.popitem(last=False)

    def moved(self, request_id: str, replica_id: str) -> None:
        """An unhashed send went to ``replica_id`` instead (Serve's first rank was full)."""
        held = self._unhashed.get(request_id)
        if held is not None:
            self._unhashed[request_id] = (replica_id, held[1], held[2])

    def _hash_early_sends(self) -> None:
        early, self._unhashed = self._unhashed, OrderedDict()
        oldest = self._clock() - RECENT_S
        for replica_id, prompt, at in early.values():
            if at >= oldest:
                self.remember(replica_id, self.chain(prompt), at)

    def forget(self, replica_id: str, chain: list[bytes]) -> None:
        """The send ``remember`` recorded went elsewhere: the replica is not known to hold ``chain``
        (its summary still says what it really holds)."""
        cache = self._replicas.get(replica_id)
        for key in chain if cache is not None else ():
            cache.recent.pop(key, None)

    def _recent_blocks(self, cache: _ReplicaCache, chain: list[bytes]) -> int:
        oldest = self._clock() - RECENT_S
        count = 0
        for key in chain:
            sent = cache.recent.get(key)
            if sent is None or sent < oldest:
                break
            count += 1
        return count
