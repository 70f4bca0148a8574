"""The load of ``bench/router_data_path.py``, run in client processes of their own (aiohttp).

Streams: closed-loop streaming completions of ``tokens`` tokens from ``bench.step_replica``; each
token's text names its index, so every token is checked to arrive in order and once, and its
lateness is its arrival minus when it was due (the first token's arrival + k × TPOT). Short:
closed-loop non-streamed completions of a few tokens. Only what ends (requests) or arrives (tokens)
inside the parent's window counts.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field

import aiohttp
import orjson

from bench.step_replica import FIRST_TOKEN_ID

MAX_SAMPLES = 200_000  # lateness samples kept per client process


@dataclass
class Plan:
    base: str
    model: str
    keys: list[str]
    kind: str  # "streams" or "short"
    clients: int
    tokens: int
    tpot_s: float
    start: float  # the measured window, time.time()
    end: float
    seed: int = 0


@dataclass
class Tally:
    ok: int = 0
    failed: int = 0
    disordered: int = 0  # streams whose tokens were not exactly 0..n-1 in order
    tokens: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    lateness: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)  # between consecutive SSE events of a stream


def run(plan: Plan) -> Tally:
    return asyncio.run(_run(plan))


async def _run(plan: Plan) -> Tally:
    tally = Tally()
    rng = random.Random(plan.seed)
    keys = itertools.cycle(plan.keys)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(plan.base, connector=connector, timeout=timeout) as session:
        worker = _stream if plan.kind == "streams" else _short
        tasks = [
            asyncio.create_task(_loop(worker, session, plan, tally, keys, rng)) for _ in range(plan.clients)
        ]
        await asyncio.sleep(max(0.0, plan.end - time.time()))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return tally


async def _loop(worker, session, plan: Plan, tally: Tally, keys, rng: random.Random) -> None:
    await asyncio.sleep(rng.uniform(0, 0.5))  # spread the first requests
    while time.time() < plan.end:
        headers = {"Authorization": f"Bearer {next(keys)}", "Content-Type": "application/json"}
        try:
            await worker(session, plan, tally, headers)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if plan.start <= time.time() <= plan.end:
                tally.failed += 1
                name = type(exc).__name__
                tally.errors[name] = tally.errors.get(name, 0) + 1


def _body(plan: Plan, stream: bool) -> bytes:
    return orjson.dumps(
        {"model": plan.model, "prompt": "tell me a story " * 8, "max_tokens": plan.tokens, "stream": stream}
    )


async def _short(session, plan: Plan, tally: Tally, headers: dict) -> None:
    async with session.post("/v1/completions", data=_body(plan, False), headers=headers) as resp:
        body = await resp.read()
    now = time.time()
    if not plan.start <= now <= plan.end:
        return
    if resp.status != 200:
        raise RuntimeError(f"status {resp.status}: {body[:80]!r}")
    tally.ok += 1
    tally.tokens += orjson.loads(body)["usage"]["completion_tokens"]


async def _stream(session, plan: Plan, tally: Tally, headers: dict) -> None:
    arrivals: list[tuple[float, int]] = []  # (arrival, token index) per token
    async with session.post("/v1/completions", data=_body(plan, True), headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"status {resp.status}")
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            now = time.time()
            chunk = orjson.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"].get("code") or "stream_error")
            for choice in chunk.get("choices", ()):
                for word in choice["text"].split():
                    arrivals.append((now, int(word[1:]) - FIRST_TOKEN_ID))
    _count(plan, tally, arrivals)


def _count(plan: Plan, tally: Tally, arrivals: list[tuple[float, int]]) -> None:
    end = arrivals[-1][0] if arrivals else time.time()
    tally.tokens += sum(plan.start <= t <= plan.end for t, _ in arrivals)
    if not plan.start <= end <= plan.end:
        return
    if [k for _, k in arrivals] != list(range(plan.tokens)):
        tally.disordered += 1
        return
    tally.ok += 1
    first = arrivals[0][0]
    keep = len(tally.lateness) < MAX_SAMPLES
    previous = first
    for t, k in arrivals[1:]:
        if keep:
            tally.lateness.append(max(0.0, t - (first + k * plan.tpot_s)))
        if t != previous and keep:
            tally.gaps.append(t - previous)
        previous = t
