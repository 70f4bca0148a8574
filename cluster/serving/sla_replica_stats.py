"""A replica's part of the SLA policy's inputs: its measured start and its Serve autoscaling hook.

The start is measured by the replica itself: from its process's start (Ray starting the actor,
imports) to the engine serving (weights loaded, KV cache allocated, CUDA graphs captured), and the
engine's own part (load + graph capture) beside it. Under ``autoscaling.policy: sla`` the hook
(``ReplicaServer.sla_stats``, Serve's ``record_autoscaling_stats``) reads the routers' class loads
for this deployment from the board and returns them flat (``sla_metrics.py``) with the engine's
running requests, its recent steps' pace (what they took, for the policy's speed calibration) and
this start time.
"""

from __future__ import annotations

import asyncio
import time

import psutil

from cluster.serving import sla_board
from cluster.serving.sla_metrics import combine, flatten

# A process older than this beyond the engine's load is a worker Ray started earlier and reused: its
# age says nothing of this replica's start, so the engine's own part stands for it.
REUSED_WORKER_S = 300.0


def measured_start(load_s: float) -> float:
    """Seconds from this process's start to now (the replica about to serve), or ``load_s``."""
    age = time.time() - psutil.Process().create_time()
    return age if load_s <= age <= load_s + REUSED_WORKER_S else load_s


async def sla_stats(
    app: str, deployment: str, running: float, start_s: float, pace: dict[str, float]
) -> dict[str, float]:
    payloads = await asyncio.to_thread(sla_board.fresh_signals, app, deployment)
    classes, batch, price = combine(payloads)
    return flatten(classes, batch, price, running, start_s, pace)
