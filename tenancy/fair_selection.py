"""The fair queue's two decisions over its tiers: which tenant goes next, and where a returning
tenant's counter starts (docs/tenancy.md, "Selection rule" and "Lift")."""

from __future__ import annotations

from collections.abc import Sequence

from tenancy.fair_lanes import Eligible, Tier, TierHeaps


def choose(heaps: TierHeaps, tiers: Sequence[Tier], now: float, eligible: Eligible | None) -> str | None:
    """The tenant to pop next: the smallest counter among eligible backlogged tenants of the tiers
    up to the most urgent one (all tiers when none is urgent); ties to the more urgent tier, then
    the older head. ``tiers`` in order, most urgent first."""
    urgent = next((i for i, t in enumerate(tiers) if is_urgent(heaps, t, now, eligible)), None)
    candidates = tiers if urgent is None else tiers[: urgent + 1]
    best: tuple[float, int, int, str] | None = None
    for rank, tier in enumerate(candidates):
        top = heaps.top(tier, eligible)
        if top is not None and (best is None or (top[0], rank, top[1]) < best[:3]):
            best = (top[0], rank, top[1], top[3])
    return None if best is None else best[3]


def is_urgent(heaps: TierHeaps, tier: Tier, now: float, eligible: Eligible | None) -> bool:
    """An at-risk head, or a returning tenant at the top (its first request goes at once, as a
    sparse flow's: it is the tier's smallest counter, so the order within the tier is kept)."""
    return heaps.at_risk(tier, now, eligible) or heaps.fresh_top(tier, eligible)


def lift_level(heaps: TierHeaps, tier: Tier, tiers: Sequence[Tier]) -> float:
    """The counter a tenant of ``tier`` returning from idle starts at, at least: the smallest
    counter waiting in its tier, else the larger of its floor and the smallest waiting anywhere
    (the highest floor when nothing waits). The tier's floor is raised to it."""
    own = heaps.top(tier)
    if own is not None:
        level = own[0]
    else:
        tops = [t for t in (heaps.top(x) for x in tiers) if t is not None]
        level = min(tops)[0] if tops else max(x.floor for x in tiers)
    tier.floor = max(level, tier.floor)
    return tier.floor
