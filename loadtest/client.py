"""One streamed request to an OpenAI-compatible endpoint, turned into a ``RequestRecord``.

Every call ends with a status: completion (ok), HTTP error, timeout (the request's own bound),
connection/stream error, or cut (the run's drain ended first: ``loadtest/drain.py``). It never raises
for request failures.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import httpx

from loadtest.records import CUT_ERROR, RequestRecord
from loadtest.sampling_mix import endpoint_fields

Clock = Callable[[], float]


def request_body(
    endpoint: str, model: str, prompt: str, max_tokens: int, sampling: dict | None = None
) -> dict:
    """A streamed request; `sampling` (temperature, top_p, seed, ...) defaults to greedy."""
    body: dict = {
        "model": model,
        "max_tokens": max_tokens,
        **(endpoint_fields(sampling, endpoint) if sampling is not None else {"temperature": 0.0}),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def endpoint_path(endpoint: str) -> str:
    return "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"


def apply_event(record: RequestRecord, data: dict, now: float) -> None:
    """Fold one SSE event into the record: token arrival times, usage, server id, errors."""
    if "error" in data:
        err = data["error"]
        record.status = "stream_error"
        record.error = (
            f"stream:{err.get('code') or err.get('type') or 'error'}" if isinstance(err, dict) else "stream"
        )
        return
    record.server_id = record.server_id or data.get("id")
    if data.get("usage"):
        record.prompt_tokens = int(data["usage"].get("prompt_tokens") or 0)
        record.output_tokens = int(data["usage"].get("completion_tokens") or 0)
    for choice in data.get("choices") or []:
        # The first chunk carrying a choice marks the first token (it may hold an empty delta
        # while a multi-byte character is incomplete; the server timed that token too).
        if record.first_token is None:
            record.first_token = now
        index = int(choice.get("index") or 0)
        record.choices = max(record.choices, index + 1)
        text = (choice.get("delta") or {}).get("content") if "delta" in choice else choice.get("text")
        if text and index == 0:  # inter-token gaps of one answer (n > 1 answers interleave)
            record.token_times.append(now)


async def _consume(response: httpx.Response, record: RequestRecord, clock: Clock) -> None:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        apply_event(record, json.loads(payload), clock())
        if record.status == "stream_error":
            return
    if record.output_tokens == 0:  # a server without a usage chunk: count content chunks
        record.output_tokens = len(record.token_times)
    record.status = "ok"


async def send(
    client: httpx.AsyncClient,
    record: RequestRecord,
    path: str,
    body: dict,
    headers: dict[str, str],
    timeout_s: float,
    clock: Clock,
) -> RequestRecord:
    """Send and stream one request within ``timeout_s``; fills and returns ``record``."""
    record.sent = clock()
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", path, json=body, headers=headers) as response:
                record.http_status = response.status_code
                if response.status_code != 200:
                    await response.aread()
                    record.status, record.error = "http_error", _error_code(response)
                else:
                    await _consume(response, record, clock)
    except TimeoutError:
        record.status, record.error = "timeout", "client_timeout"
    except asyncio.CancelledError:
        record.status, record.error = "cut", CUT_ERROR
        record.end = clock()
        raise
    except (httpx.TransportError, json.JSONDecodeError) as exc:
        record.status, record.error = "connection_error", type(exc).__name__
    record.end = clock()
    return record


def _error_code(response: httpx.Response) -> str:
    code = None
    try:
        err = response.json().get("error", {})
        code = err.get("code") or err.get("type")
    except (ValueError, AttributeError):
        pass
    return f"{response.status_code}:{code or 'error'}"


def monotonic_since(start: float) -> Clock:
    return lambda: time.monotonic() - start
