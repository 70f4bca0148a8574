"""Settled service: the weighted tokens each tenant has *received* by each sample time, from the
request outcomes; the within-tier gap and Jain's index (``summary.py``) are taken over it.

The load generator's definition (``loadtest/fairness.py``) and VTC's (the service a client received
in an interval, which its fairness bound holds to): a request's prompt counts (× 1) when its first
token arrives (prefill done), its output (× 2) as it streams; the simulator does not time tokens one
by one, so output accrues linearly from first token to end. Divided by the tenant's weight. Work
dispatched but not yet received is not counted: the fair queue charges a reservation at dispatch,
so its counters run ahead of delivery by the work in flight, and a gap over those charges would
measure the order of dispatch, not what tenants got. A failed request delivers nothing.
"""

from __future__ import annotations

import numpy as np

from loadtest.sim.outcomes import OK, Outcomes
from loadtest.sim.workload import Trace


def delivered_service(trace: Trace, outcomes: Outcomes, times: np.ndarray) -> np.ndarray:
    """``[sample, tenant]`` cumulative weighted service received by ``times[sample]``."""
    n_tenants = len(trace.tenants)
    out = np.zeros((len(times), n_tenants))
    ok = np.flatnonzero(outcomes.status == OK)
    if len(times) == 0 or len(ok) == 0:
        return out
    weight = np.array([t.weight for t in trace.tenants])[trace.tenant[ok]]
    tenant = trace.tenant[ok]
    first, end = outcomes.first_token[ok], outcomes.end[ok]
    prompt = trace.prompt[ok] / weight
    output = 2.0 * outcomes.output[ok] / weight
    step = np.zeros((len(times) + 1, n_tenants))
    f = np.searchsorted(times, first, side="left")  # first sample at or after the first token
    e = np.searchsorted(times, end, side="left")  # first sample at or after the end
    np.add.at(step, (f, tenant), prompt)
    np.add.at(step, (e, tenant), output)
    out += np.cumsum(step, axis=0)[:-1]
    span = np.maximum(end - first, 1e-12)
    k = f.copy()
    while True:  # samples strictly inside a stream get the produced part of its output
        inside = k < e
        if not inside.any():
            break
        idx = np.flatnonzero(inside)
        frac = (times[k[idx]] - first[idx]) / span[idx]
        np.add.at(out, (k[idx], tenant[idx]), output[idx] * frac)
        k[idx] += 1
    return out
