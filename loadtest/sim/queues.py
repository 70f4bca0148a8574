"""The simulated router's waiting queue: the real ``tenancy.FairQueue`` under one of the cluster's
three dispatch policies (``fcfs``, ``vtc``, ``fairlane``; ``tenancy/dispatch_policy.py``), the same
code ``fairlane serve --dispatch-policy`` runs."""

from __future__ import annotations

from collections.abc import Callable

from tenancy import DispatchPolicy, FairQueue, TenancyConfig


def make_queue(order: DispatchPolicy, config: TenancyConfig, clock: Callable[[], float]) -> FairQueue:
    return FairQueue.from_config(config, clock, order)
