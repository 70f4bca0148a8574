"""The admission lease: what the router keeps for one admitted request and hands back at its end."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Backend = Literal["memory", "redis", "local"]


@dataclass(slots=True)
class Lease:
    """One admitted request's hold on its tenant's quotas.

    ``reserved_tokens`` (prompt + max_tokens) were taken from the TPM bucket and daily budget at
    admission; ``release`` settles them against the tokens really used. ``backend`` says which
    store holds the concurrency slot ("local" = the fallback while Redis was unreachable).
    """

    lease_id: str
    tenant_id: str
    prompt_tokens: int
    max_tokens: int
    reserved_tokens: int
    budget_day: int
    backend: Backend
    acquired_at: float
    headers: dict[str, str] = field(default_factory=dict)
    released: bool = False
