"""Token-bucket arithmetic shared by the memory store (the Redis Lua scripts mirror it line by line).

A bucket of capacity ``C`` per minute refills at ``C / 60`` per second and starts full. Its level
may go below zero when a request used more than it reserved (debt is paid back by refill).
"""

from __future__ import annotations

from dataclasses import dataclass

SECONDS_PER_MINUTE = 60.0


def refill_rate(capacity: float) -> float:
    """Tokens per second of a bucket that holds (and refills) ``capacity`` per minute."""
    return capacity / SECONDS_PER_MINUTE


@dataclass(slots=True)
class TokenBucket:
    """Level and last update time; capacity is passed in so a config change takes effect at once."""

    level: float
    updated_at: float

    @classmethod
    def full(cls, capacity: float, now: float) -> TokenBucket:
        return cls(level=float(capacity), updated_at=now)

    def refill(self, capacity: float, now: float) -> None:
        """Bring the level up to ``now``; a clock that steps back adds nothing."""
        elapsed = max(0.0, now - self.updated_at)
        self.level = min(float(capacity), self.level + elapsed * refill_rate(capacity))
        self.updated_at = max(self.updated_at, now)

    def wait_for(self, amount: float, capacity: float) -> float:
        """Seconds until the (refilled) level reaches ``amount``; 0 when it already has."""
        return max(0.0, (amount - self.level) / refill_rate(capacity))

    def give_back(self, amount: float, capacity: float) -> None:
        """Add ``amount`` (negative to charge a debt), never above capacity."""
        self.level = min(float(capacity), self.level + amount)
