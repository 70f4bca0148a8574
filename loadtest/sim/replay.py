"""A load-test run's own requests as a simulator trace (the fidelity check's input).

The simulator normally draws its trace from a scenario's laws (``workload.build_trace``). To
compare it with a real run, it must see *the same* requests: each served request's send time,
its prompt tokens as the server counted them (chat template included) and its output tokens as
produced (the model may stop at EOS before ``max_tokens``; the simulator always produces exactly
``max_tokens``, so the replay sets ``max_tokens`` to what was produced).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loadtest.records import RequestRecord
from loadtest.sim.workload import SimTenant, Trace
from tenancy import TenancyConfig


@dataclass(frozen=True, slots=True)
class Replay:
    """The trace and, for each of its requests, the real record it replays (same order)."""

    trace: Trace
    source: tuple[RequestRecord, ...]
    dropped: int  # records that never reached the engine (errors, cancellations)


def replay_trace(records: Sequence[RequestRecord], tenancy: TenancyConfig) -> Replay:
    """Served requests of a run, sorted by send time, with the cluster's tenants (weights, classes)."""
    served = sorted(
        (r for r in records if r.ok and r.output_tokens > 0), key=lambda r: (r.sent, r.request_id)
    )
    by_id = {t.id: t for t in tenancy.tenants}
    missing = sorted({r.tenant for r in served} - set(by_id))
    if missing:
        raise ValueError(f"tenants {missing} are in the run but not in the tenancy config")
    ids = sorted({r.tenant for r in served})
    index = {tid: i for i, tid in enumerate(ids)}
    span = max((r.sent for r in served), default=0.0) or 1.0
    tenants = tuple(_tenant(by_id[tid], [r for r in served if r.tenant == tid], span) for tid in ids)
    trace = Trace(
        tenants,
        np.array([r.sent for r in served], dtype=float),
        np.array([index[r.tenant] for r in served], dtype=np.int32),
        np.array([r.prompt_tokens for r in served], dtype=np.int32),
        np.array([r.output_tokens for r in served], dtype=np.int32),
        duration_s=span,
        capacity_rps=0.0,  # not estimated: the replay's rates are the run's
    )
    return Replay(trace, tuple(served), len(records) - len(served))


def _tenant(t, records: list[RequestRecord], span: float) -> SimTenant:
    largest = max(r.prompt_tokens + r.output_tokens for r in records)
    return SimTenant(t.id, t.sla_class, t.weight, len(records) / span, t.id, largest)
