"""Hand-built request records for the metric tests."""

from __future__ import annotations

from loadtest.records import RequestRecord


def rec(
    tenant: str = "a",
    sent: float = 0.0,
    tokens: tuple[float, ...] = (),
    end: float | None = None,
    prompt: int = 10,
    sla: str = "interactive",
    weight: float = 1.0,
    status: str = "ok",
    http_status: int | None = 200,
    error: str | None = None,
) -> RequestRecord:
    """A record whose first token is the first of ``tokens`` and whose output is ``len(tokens)``."""
    return RequestRecord(
        request_id=f"{tenant}-{sent}",
        tenant=tenant,
        sla_class=sla,
        weight=weight,
        scheduled=sent,
        sent=sent,
        first_token=tokens[0] if tokens else None,
        token_times=list(tokens),
        end=end if end is not None else (tokens[-1] if tokens else sent),
        prompt_tokens=prompt,
        output_tokens=len(tokens),
        status=status,  # type: ignore[arg-type]
        http_status=http_status,
        error=error,
    )
