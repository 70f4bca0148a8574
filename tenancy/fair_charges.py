"""What a dispatch costs its tenant in the fair queue's counters (weighted tokens).

A request is charged its **reservation** when it is dispatched: ``prompt × 1 + max_tokens × 2``.
When it ends it is **settled** against what it used: unproduced output is refunded (× 2), and
prompt tokens the replica served from its prefix cache cost ``cached_prompt_token_cost`` each
instead of 1 (the rest of their charge is refunded). Charging the reservation up front keeps the
counters of tenants with work in flight current: a tenant is never picked again on a counter that
does not yet show the output it has already been granted (docs/tenancy.md, the fairness bound).
"""

from __future__ import annotations

from tenancy.queued_request import QueuedRequest

INPUT_TOKEN_COST = 1.0
OUTPUT_TOKEN_COST = 2.0
DEFAULT_CACHED_PROMPT_TOKEN_COST = 0.1


def reservation(request: QueuedRequest) -> float:
    """Unweighted tokens charged at dispatch: the most the request can cost."""
    return INPUT_TOKEN_COST * request.prompt_tokens + OUTPUT_TOKEN_COST * request.max_tokens


def settlement(request: QueuedRequest, output_tokens: int, cached_tokens: int, cached_cost: float) -> float:
    """Unweighted tokens to add at the end (negative: a refund): actual cost minus the reservation."""
    if output_tokens < 0 or cached_tokens < 0:
        raise ValueError("token counts must be >= 0")
    cached = min(cached_tokens, request.prompt_tokens)
    unused_output = request.max_tokens - output_tokens
    return -OUTPUT_TOKEN_COST * unused_output - (INPUT_TOKEN_COST - cached_cost) * cached
