"""What the request flow runs: a validated, tokenized request (``Job``) and the waits it may take."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tenancy import Tenant


@dataclass(frozen=True, slots=True)
class Job:
    """A validated, tokenized request ready for admission."""

    request_id: str
    tenant: Tenant
    sla_class: str
    prompt_ids: list[int]
    sampling: dict[str, Any]
    coalesce_s: float = 0.0
    user: str | None = None  # the request's OpenAI `user`: recorded with its timing, nothing else
    cache_salt: str | None = None  # vLLM's cache_salt: only requests with the same salt share cached blocks
    adapter: str | None = (
        None  # the LoRA adapter the request's `model` names (cluster/routing/adapter_registry.py)
    )
    adapter_path: str | None = None  # its directory, read by the replica that first serves it

    @property
    def max_tokens(self) -> int:
        """The request's output budget: max_tokens for each of its n choices."""
        return int(self.sampling["max_tokens"]) * self.choices

    @property
    def choices(self) -> int:
        """The answers it asks for (n; best_of for a completion that ranks its samples)."""
        return int(self.sampling.get("n", 1))


@dataclass(frozen=True, slots=True)
class Timeouts:
    first_token_s: float
    token_s: float
    first_token_retries: int = 0
