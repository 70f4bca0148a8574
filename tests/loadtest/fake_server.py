"""A tiny OpenAI-compatible SSE server on loopback (uvicorn in a thread) with scripted behaviours.

The API key picks the behaviour, so one server covers every client-bound test:
``ok`` streams tokens every ``TOKEN_GAP_S``; ``long`` every ``LONG_TOKEN_GAP_S`` (an answer that outlasts
the load); ``slow`` stalls longer than any test's timeout;
``reject`` answers 429; ``boom`` answers 500; ``broken`` sends a stream error event; ``capped``
streams like ``ok`` after holding the server alone for ``CAPPED_HOLD_S`` (one request at a time),
so the server's capacity is 1 / ``CAPPED_HOLD_S`` requests per second (the capacity sweep's test).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tests.redis_server import free_port

TOKEN_GAP_S = 0.01
LONG_TOKEN_GAP_S = 0.1
FIRST_TOKEN_DELAY_S = 0.02
CAPPED_HOLD_S = 0.05


def _chunk(text: str) -> bytes:
    data = {"id": "chatcmpl-fake", "choices": [{"index": 0, "delta": {"content": text}}]}
    return f"data: {json.dumps(data)}\n\n".encode()


async def _tokens(n: int, prompt_tokens: int, gap_s: float = TOKEN_GAP_S):
    await asyncio.sleep(FIRST_TOKEN_DELAY_S)
    for i in range(n):
        yield _chunk(f"t{i} ")
        await asyncio.sleep(gap_s)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
    yield f"data: {json.dumps({'id': 'chatcmpl-fake', 'choices': [], 'usage': usage})}\n\n".encode()
    yield b"data: [DONE]\n\n"


async def _capped(gate: asyncio.Semaphore, n: int, prompt_tokens: int):
    async with gate:  # the service time: one request at a time
        await asyncio.sleep(CAPPED_HOLD_S)
    async for part in _tokens(n, prompt_tokens):
        yield part


async def _stall():
    await asyncio.sleep(3600)
    yield b""


async def _broken():
    yield _chunk("a")
    yield b'data: {"error": {"code": "token_timeout", "message": "x"}}\n\n'


class FakeState:
    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.received = 0


def make_app(state: FakeState) -> Starlette:
    gate = asyncio.Semaphore(1)

    async def chat(request: Request):
        body = await request.json()
        behaviour = request.headers.get("authorization", "").removeprefix("Bearer ")
        state.received += 1
        if behaviour == "reject":
            return JSONResponse({"error": {"code": "rate_limit_exceeded"}}, status_code=429)
        if behaviour == "boom":
            return JSONResponse({"error": {"type": "server_error"}}, status_code=500)
        prompt_tokens = len(body["messages"][0]["content"].split())
        stream = {"slow": _stall, "broken": _broken}.get(behaviour)
        if behaviour == "capped":
            gen = _capped(gate, body["max_tokens"], prompt_tokens)
        elif behaviour == "long":
            gen = _tokens(body["max_tokens"], prompt_tokens, LONG_TOKEN_GAP_S)
        else:
            gen = stream() if stream else _tokens(body["max_tokens"], prompt_tokens)
        return StreamingResponse(_counted(state, gen), media_type="text/event-stream")

    async def health(_: Request):
        return JSONResponse({"status": "ok", "replicas": 2})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", health)])


async def _counted(state: FakeState, gen):
    state.in_flight += 1
    state.max_in_flight = max(state.max_in_flight, state.in_flight)
    try:
        async for part in gen:
            yield part
    finally:
        state.in_flight -= 1


@contextmanager
def fake_server() -> Iterator[tuple[str, FakeState]]:
    state = FakeState()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(state), host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        server.should_exit = True
        thread.join(timeout=10)
