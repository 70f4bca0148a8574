"""Direct dispatch: a router sends each request straight to the replica it chose, not through Serve.

A Serve call costs the router its handle machinery per request (the request router's thread, its
metrics, the gRPC or actor call): most of a short request's router CPU (docs/cluster.md, "Router
throughput"). With ``direct_dispatch`` the router keeps one TCP connection per replica
(``replica_link.py``; the replica's end is ``cluster/serving/submit_server.py``) and ranks the
replicas itself with the cost Serve's ``KVAwareRouter`` uses (``replica_ranking.py``):

* **Which replicas**: those on the replica board (``cluster/serving/replica_board.py``: each replica
  publishes its submit address and key with its load every second) that Serve still routes to
  (``live_replicas``: a replica being stopped takes no new work; its requests run on).
* **Their load**: each link asks its replica for its routing stats every ``STATS_EVERY_S`` (the
  same stats and prefix-cache summary Serve's request router reads), plus what this router sent
  since (``SentSinceReport``). The requests on a replica are this router's own, counted exactly
  (the link's pending answers), plus the others' as of the last stats.
* **Failure**: a broken link fails its requests (re-dispatched before their first token, as after a
  replica's death under Serve) and its replica is left out for ``HOLD_BROKEN_S``.

No replica known yet (start-up, or every link broken): ``submit`` returns None and the request goes
through Serve, so nothing waits on discovery.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from cluster.routing.prefix_affinity import PrefixAffinity, Prompt
from cluster.routing.replica_link import DirectCall, ReplicaLink
from cluster.routing.replica_ranking import ReplicaChoice, ReplicaState, replica_cost
from cluster.routing.sent_since_report import SentSinceReport
from cluster.serving.wire import GenerateArgs

log = logging.getLogger(__name__)

STATS_EVERY_S = 0.5  # Serve's routing-stats period for its own request router (cluster.app)
STATS_TIMEOUT_S = 2.0
BOARD_EVERY_S = 1.0  # the board is written every second
HOLD_BROKEN_S = 5.0  # a replica whose link broke: tried again after this (if still on the board)

ReadBoard = Callable[[], Awaitable[dict[str, dict]]]
ReadLive = Callable[[], frozenset[str] | None]


@dataclass(slots=True)
class _Replica:
    link: ReplicaLink
    stats: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    summary_at: float | None = None
    others: int = 0  # requests on the replica that other routers sent, as of its last stats
    listed: bool = True  # on the board at the last read; off it, it takes nothing new


class DirectDispatch:
    """One model's replicas as this router reaches them directly; the choice among them."""

    def __init__(self, model: str, choice: ReplicaChoice = "prefix") -> None:
        self.model = model
        self._choice = choice
        self._replicas: dict[str, _Replica] = {}
        self._live: frozenset[str] | None = None  # as of the last board read
        self._read_live: ReadLive | None = None  # the set as Serve's request router last heard it
        self._sent = SentSinceReport()
        self._affinity = PrefixAffinity()
        self._task: asyncio.Task | None = None
        self.sent = 0  # requests sent directly (the rest went through Serve): /admin/state

    def start(self, read_board: ReadBoard, read_live: ReadLive) -> None:
        self.follow_live(read_live)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(read_board, read_live))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for replica in self._replicas.values():
            await replica.link.close()
        self._replicas.clear()

    def follow_live(self, read_live: ReadLive) -> None:
        """Read the replicas Serve routes to at every choice: a replica Serve stops takes nothing new
        from that moment (it used to take requests until the next board read, up to 1.5 s later)."""
        self._read_live = read_live

    @property
    def replicas(self) -> list[str]:
        """The replicas a request may be sent to now."""
        live = self._live_now()
        return [rid for rid, r in self._replicas.items() if self._choosable(rid, r, live)]

    def submit(self, args: GenerateArgs) -> DirectCall | None:
        """Send the request to the cheapest replica; None when none is reachable (use Serve)."""
        live = self._live_now()
        candidates = [(rid, r) for rid, r in self._replicas.items() if self._choosable(rid, r, live)]
        if not candidates:
            return None
        chain: list[bytes] = []
        prompt = Prompt(args.request_id, args.prompt_ids, args.cache_scope())
        if self._choice == "prefix":
            chain = self._affinity.chain(prompt)
        block = self._affinity.block_size()
        prompt_tokens = len(args.prompt_ids)

        def cost(candidate: tuple[str, _Replica]) -> tuple[float, float]:
            rid, replica = candidate
            stats = replica.stats
            waiting = float(stats.get("waiting_tokens", 0))
            state = ReplicaState(
                waiting_tokens=self._sent.reported_waiting(rid, waiting, stats.get("reported_at")),
                unreported_tokens=self._sent.tokens(rid, stats.get("reported_at")),
                ongoing=len(replica.link.pending) + replica.others,
                kv_free_tokens=float(stats.get("kv_blocks_free", 0)) * block,
                hit_tokens=self._affinity.hit_blocks(rid, chain) * block if chain else 0,
                adapter_missing=args.adapter is not None and args.adapter not in stats.get("adapters", ()),
            )
            return replica_cost(state, prompt_tokens)

        rid, replica = min(candidates, key=cost)
        hit = self._affinity.hit_blocks(rid, chain) * block if chain else 0
        sampling = args.sampling
        tokens = prompt_tokens - hit + int(sampling.get("max_tokens", 16)) * int(sampling.get("n", 1))
        self._sent.chose(args.request_id, rid, tokens)
        if self._choice == "prefix":
            self._affinity.remember_send(rid, prompt, chain)
        self.sent += 1
        call = replica.link.submit(args)
        call.on_end(lambda: self._sent.ended(rid, args.request_id))
        return call

    def _live_now(self) -> frozenset[str] | None:
        live = self._read_live() if self._read_live is not None else None
        return self._live if live is None else live

    @staticmethod
    def _choosable(rid: str, replica: _Replica, live: frozenset[str] | None) -> bool:
        return replica.listed and replica.link.broken is None and (live is None or rid in live)

    def update(self, board: dict[str, dict], live: frozenset[str] | None) -> None:
        """This model's replicas on the board (``board``: replica id -> published load)."""
        listed = {
            rid: load
            for rid, load in board.items()
            if load.get("model") == self.model and load.get("submit_address")
        }
        now = time.monotonic()
        for rid, load in listed.items():
            known = self._replicas.get(rid)
            retry = known is not None and known.link.broken is not None
            if known is None or (retry and now - known.link.broken_at > HOLD_BROKEN_S):
                link = ReplicaLink(rid, load["submit_address"], load["submit_key"])
                self._replicas[rid] = _Replica(link)
            else:
                known.listed = True
        # Off the board: stopped (its key removed) or stale (killed, or its GCS writes late). It takes
        # nothing new; its link closes once its requests have ended (a dead one's link breaks anyway).
        for gone in set(self._replicas) - set(listed):
            replica = self._replicas[gone]
            replica.listed = False
            if not replica.link.pending:
                asyncio.get_running_loop().create_task(self._replicas.pop(gone).link.close())
        self._live = live
        self._affinity.keep_only(set(self._replicas))
        self._sent.forget_replicas(set(self._replicas))

    async def refresh_stats(self) -> None:
        """Every reachable replica's routing stats, asked for at once."""
        replicas = [(rid, r) for rid, r in self._replicas.items() if r.link.broken is None]
        own = [len(r.link.pending) for _, r in replicas]  # this router's requests there as it asks
        answers = await asyncio.gather(
            *(r.link.stats(STATS_TIMEOUT_S) for _, r in replicas), return_exceptions=True
        )
        for (rid, replica), mine, stats in zip(replicas, own, answers, strict=True):
            if isinstance(stats, BaseException) or not isinstance(stats, dict):
                continue  # a slow or broken replica keeps its previous stats
            replica.stats = stats
            ongoing = int(stats.get("running", 0)) + int(stats.get("waiting", 0))
            replica.others = max(0, ongoing - mine)
            if self._choice == "prefix":
                self._affinity.update(rid, _summary(replica, stats))

    async def _run(self, read_board: ReadBoard, read_live: ReadLive) -> None:
        board_at = float("-inf")
        while True:
            try:
                if time.monotonic() - board_at >= BOARD_EVERY_S:
                    self.update(await read_board(), read_live())
                    board_at = time.monotonic()
                await self.refresh_stats()
            except Exception as exc:  # the GCS busy: the next round tries again
                log.warning("direct dispatch refresh failed (%s): %r", self.model, exc)
            await asyncio.sleep(STATS_EVERY_S)


def _summary(replica: _Replica, stats: dict[str, Any]) -> dict[str, Any] | None:
    """The prefix-cache summary of ``stats`` (its bits base64 on the wire), decoded once per new one."""
    wire = stats.get("prefix_summary")
    if wire is None:
        return None
    if stats.get("summary_at") != replica.summary_at or replica.summary is None:
        replica.summary = {**wire, "bits": base64.b64decode(wire["bits"])}
        replica.summary_at = stats.get("summary_at")
    return replica.summary
