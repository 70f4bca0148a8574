"""Per-request timing records: when each request arrived, was admitted, dispatched, answered, ended."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Literal

Outcome = Literal["ok", "rejected", "invalid", "error", "timeout", "aborted"]


@dataclass(slots=True)
class RequestTiming:
    """Monotonic timestamps (seconds) of one request's life; None for stages it never reached."""

    request_id: str
    tenant_id: str
    sla_class: str
    arrival: float
    admitted: float | None = None
    dispatched: float | None = None
    first_token: float | None = None
    end: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    outcome: Outcome | None = None
    reason: str | None = None
    replica_id: str | None = None
    model: str = ""
    adapter: str | None = None  # the LoRA adapter it ran with (the ledger's row names it)
    key_id: str = ""  # the API key's short id (cluster/ledger/rows.py), never the key
    itl_p99: float | None = None  # the 99th percentile of inter-token gaps, set at the end
    user: str | None = None  # the end user the client named (OpenAI's `user`), within its tenant
    cached_tokens: int = 0  # prompt tokens the replica found in its prefix cache
    # Where a first token's time goes beyond this router's stamps: the HTTP request's entry into the
    # router's ASGI app (before parsing, auth, templating and tokenizing), and the engine's own
    # durations from the request's arrival at the replica to its first step and to its first token.
    received: float | None = None
    engine_queue: float | None = None
    engine_ttft: float | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.arrival

    @property
    def tpot(self) -> float | None:
        """(E2E − TTFT) / (output tokens − 1), as ``vllm bench serve`` defines it."""
        if self.end is None or self.first_token is None or self.output_tokens < 2:
            return None
        return (self.end - self.first_token) / (self.output_tokens - 1)

    @property
    def queue_wait(self) -> float | None:
        if self.dispatched is None:
            return None
        return self.dispatched - (self.admitted if self.admitted is not None else self.arrival)

    def to_dict(self) -> dict:
        return asdict(self) | {"ttft": self.ttft, "tpot": self.tpot, "e2e": self.e2e}


class TimingRecorder:
    """The last ``capacity`` finished records of this router, plus the replica-seconds used (in all
    and per model)."""

    def __init__(self, capacity: int = 50_000) -> None:
        self._records: deque[RequestTiming] = deque(maxlen=capacity)
        self.started = time.monotonic()
        self.replica_seconds = 0.0
        self.model_replica_seconds: dict[str, float] = {}
        self._last_tick: float | None = None
        # Called with every finished record (the ledger's queue); must not block or raise.
        self.sink: Callable[[RequestTiming], None] | None = None

    def add(self, record: RequestTiming) -> None:
        self._records.append(record)
        if self.sink is not None:
            self.sink(record)

    @property
    def started_wall(self) -> float:
        """When this window began (start or last reset), in unix seconds."""
        return time.time() - (time.monotonic() - self.started)

    def records(self) -> list[RequestTiming]:
        return list(self._records)

    def clear(self) -> None:
        self._records.clear()
        self.replica_seconds = 0.0
        self.model_replica_seconds = {}
        self.started = time.monotonic()

    def tick_replicas(self, replicas: int | Mapping[str, int], now: float | None = None) -> None:
        """Integrate replicas × time (GPU-seconds when each replica holds one GPU); ``replicas`` per
        model, or one count for all."""
        now = time.monotonic() if now is None else now
        counts = {"": replicas} if isinstance(replicas, int) else replicas
        if self._last_tick is not None:
            elapsed = max(0.0, now - self._last_tick)
            for model, count in counts.items():
                self.replica_seconds += count * elapsed
                if model:
                    self.model_replica_seconds[model] = (
                        self.model_replica_seconds.get(model, 0.0) + count * elapsed
                    )
        self._last_tick = now
