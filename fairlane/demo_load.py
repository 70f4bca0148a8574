"""The load of ``fairlane demo``: one noisy tenant flooding, two quiet interactive tenants.

carol (batch) keeps more requests going than the replica has room for, so part of her work always
waits in the router; alice and dave (interactive) each ask one short question at a time, with a
seeded pause between. Every request generates exactly ``max_tokens`` (``ignore_eos``) and the
prompts and pauses come from a seeded generator, so two runs (one per dispatch policy) offer the
same work and differ only in how the router and the replica order it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from tenancy import DEMO_ADMIN_KEY, DEMO_KEYS

#: The demo tenancy file's keys: the embedded default's, plus dave (tenancy/demo_cpu_tenants.yaml).
DEMO_TENANT_KEYS: Mapping[str, str] = {**DEMO_KEYS, "dave": "sk-fairlane-dave"}

QUESTIONS = (
    "What is the capital of France?",
    "Name three primary colours.",
    "What is two plus two?",
    "Give me a synonym for happy.",
)
STORIES = (
    "Write a long story about a lighthouse keeper.",
    "Describe, in detail, how bread is made.",
    "Tell me everything about the history of Rome.",
)


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """One tenant's closed loop: ``concurrency`` workers, each starting at a time in ``start_s`` and
    waiting ``pause_s`` (a range) between the end of a request and the next."""

    tenant: str
    concurrency: int
    max_tokens: int
    pause_s: tuple[float, float] = (0.0, 0.0)
    start_s: tuple[float, float] = (0.0, 0.3)  # when its workers start, a little apart

    @property
    def quiet(self) -> bool:
        return self.concurrency == 1


@dataclass(frozen=True, slots=True)
class DemoLoad:
    tenants: tuple[TenantLoad, ...]
    duration_s: float
    seed: int = 7

    def load_of(self, tenant: str) -> TenantLoad:
        return next(t for t in self.tenants if t.tenant == tenant)


def demo_load(duration_s: float, seed: int = 7) -> DemoLoad:
    """carol floods with 16 requests of 32 tokens against a room of 8; alice and dave ask 16-token
    questions one at a time, a few tenths of a second apart, from a second in (carol's queue is
    there by then)."""
    return DemoLoad(
        (
            TenantLoad("alice", 1, 16, (0.2, 0.6), (1.0, 1.5)),
            TenantLoad("dave", 1, 16, (0.2, 0.6), (1.0, 1.5)),
            TenantLoad("carol", 16, 32),
        ),
        duration_s,
        seed,
    )


def _body(load: TenantLoad, model: str, rng: random.Random) -> dict:
    prompts = QUESTIONS if load.quiet else STORIES
    return {
        "model": model,
        "messages": [{"role": "user", "content": rng.choice(prompts)}],
        "max_tokens": load.max_tokens,
        "ignore_eos": True,  # every request the same length: both runs offer the same work
        "temperature": 0.7,
        "seed": rng.randrange(1 << 30),
    }


async def _worker(
    client: httpx.AsyncClient, load: TenantLoad, model: str, until: float, rng: random.Random
) -> None:
    headers = {"Authorization": f"Bearer {DEMO_TENANT_KEYS[load.tenant]}"}
    await asyncio.sleep(rng.uniform(*load.start_s))
    while time.monotonic() < until:
        r = await client.post("/v1/chat/completions", json=_body(load, model, rng), headers=headers)
        if r.status_code == 429:  # honour Retry-After, as a well-behaved client does
            await asyncio.sleep(float(r.headers.get("retry-after", "1")))
        low, high = load.pause_s
        if high > 0:
            await asyncio.sleep(rng.uniform(low, high))


async def lone_ttft(client: httpx.AsyncClient, model: str) -> float:
    """Seconds to a lone request's one-token answer: about its TTFT when nothing else runs."""
    headers = {"Authorization": f"Bearer {DEMO_TENANT_KEYS['alice']}"}
    body = {"model": model, "messages": [{"role": "user", "content": QUESTIONS[0]}], "max_tokens": 1}
    start = time.monotonic()
    (await client.post("/v1/chat/completions", json=body, headers=headers)).raise_for_status()
    return time.monotonic() - start


async def _warm_up(client: httpx.AsyncClient, model: str) -> float:
    """A fresh replica's first steps are slow (allocation, first kernels): run a few requests before
    the measured window, so neither policy's run pays for them. Returns a lone request's TTFT."""
    headers = {"Authorization": f"Bearer {DEMO_TENANT_KEYS['carol']}"}
    body = {"model": model, "messages": [{"role": "user", "content": STORIES[0]}], "max_tokens": 8}
    await lone_ttft(client, model)
    batch = [client.post("/v1/chat/completions", json=body, headers=headers) for _ in range(8)]
    for r in await asyncio.gather(*batch):
        r.raise_for_status()
    return min([await lone_ttft(client, model) for _ in range(3)])


@dataclass(frozen=True, slots=True)
class LoadResult:
    report: dict  # the admin SLA report of the measured window
    lone_ttft_s: float  # a lone request's TTFT, measured just before


async def run_load(base_url: str, model: str, load: DemoLoad) -> LoadResult:
    """Warm the replica up, then drive ``load`` against the cluster at ``base_url``."""
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        admin = {"Authorization": f"Bearer {DEMO_ADMIN_KEY}"}
        lone = await _warm_up(client, model)
        (await client.post("/admin/timings/reset", headers=admin)).raise_for_status()
        until = time.monotonic() + load.duration_s
        tasks = [
            _worker(client, t, model, until, random.Random(f"{load.seed}/{t.tenant}/{i}"))
            for t in load.tenants
            for i in range(t.concurrency)
        ]
        await asyncio.gather(*tasks)
        report = await client.get("/admin/sla", headers=admin)
        report.raise_for_status()
        return LoadResult(report.json(), lone)
