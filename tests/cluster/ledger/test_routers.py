"""Real routers (Ray Serve, two of them) writing one PostgreSQL ledger: either router reports the same
totals, an outage under load and a restart lose nothing, and each request is one row.

The replica is the router benchmark's paced stand-in (``bench.router_cost.PacedReplica``): the
routers do all of a request's work (auth, tokenize, admit, queue, stream, end) and the box's two
cores are not spent on an engine. The database sits behind a TCP forwarder that the drills stop
(its port refuses, its connections are cut) and start again.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest
import ray
from ray import serve
from ray.serve import context as serve_context

from bench.router_cost import PacedReplica
from cluster.app import compose, replica_options
from cluster.config import AppConfig
from tests.cluster.helpers import ADMIN, ALICE, BOB, LIMITED_KEY, ray_and_serve, write_tenancy
from tests.cluster.ledger.tcp_proxy import TcpProxy
from tests.redis_server import free_port

APP, PREFIX, MODEL = "fl-ledger", "/fl-ledger", "smollm2-135m"
STATUS_OUTCOME = {200: "ok", 400: "rejected", 404: "rejected", 429: "rejected"}


@pytest.fixture(scope="module")
def serve_port() -> Iterator[int]:
    """The running Serve's port (another test folder's), or Ray + Serve started here."""
    if ray.is_initialized():
        try:
            yield serve_context._get_global_client().http_config.port
            return
        except Exception:
            pass
    with ray_and_serve(free_port()) as port:
        yield port


def _config(tenancy: Path, dsn: str, spill: Path, poll_s: float = 0.5) -> AppConfig:
    return AppConfig.model_validate(
        {
            "engine": {"model": "llama-3.1-8b", "random_weights": True, "synthetic_tokenizer": True},
            "replica_num_cpus": 0,
            "replica_num_gpus": 0,
            "num_routers": 2,
            "replica_room": 32,
            "tenancy_config": str(tenancy),
            "ledger_dsn": dsn,
            "ledger_spill_dir": str(spill),
            "load_poll_interval_s": poll_s,
            "queue_timeout_s": 120.0,
        }
    )


def deploy(config: AppConfig) -> None:
    replicas = serve.deployment(PacedReplica, **replica_options(config)).bind(0.002)
    serve.run(compose(config, replicas), name=APP, route_prefix=PREFIX, blocking=False)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        app = serve.status().applications.get(APP)
        if app is not None and app.status == "RUNNING":
            return
        time.sleep(0.5)
    raise TimeoutError(f"{APP} did not start")


@pytest.fixture(scope="module")
def cluster(serve_port: int, pg_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The app on a fresh database behind a forwarder; yields its URL, the proxy and a redeploy."""
    name = f"fl_ledger_routers_{int(time.time())}"
    asyncio.run(_admin(pg_server, f"CREATE DATABASE {name}"))
    dsn = pg_server.rsplit("/", 1)[0] + f"/{name}"
    proxy, through = TcpProxy.for_dsn(dsn)
    proxy.start()
    root = tmp_path_factory.mktemp("ledger-routers")
    tenancy = write_tenancy(root / "tenants.yaml")
    config = _config(tenancy, through, root / "spill")
    deploy(config)
    try:
        yield {
            "url": f"http://127.0.0.1:{serve_port}{PREFIX}",
            "proxy": proxy,
            "dsn": dsn,
            "redeploy": lambda: deploy(_config(tenancy, through, root / "spill", poll_s=0.6)),
            "spill": root / "spill",
        }
    finally:
        serve.delete(APP)
        proxy.close()
        asyncio.run(_admin(pg_server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


async def _admin(dsn: str, statement: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def ledger_outcomes(dsn: str) -> Counter[str]:
    conn = await asyncpg.connect(dsn)
    try:
        query = "SELECT outcome, count(*) AS n FROM ledger_requests WHERE app = $1 GROUP BY 1"
        rows = await conn.fetch(query, APP)
    except asyncpg.UndefinedTableError:
        return Counter()
    finally:
        await conn.close()
    return Counter({r["outcome"]: r["n"] for r in rows})


async def ledger_ok_ids(dsn: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        query = "SELECT request_id FROM ledger_requests WHERE app = $1 AND outcome = 'ok'"
        rows = await conn.fetch(query, APP)
    finally:
        await conn.close()
    return {r["request_id"] for r in rows}


class Client:
    """Sends a mix of requests and counts what the ledger should hold: ok ids and refusals."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.outcomes: Counter[str] = Counter()
        self.ok_ids: set[str] = set()

    async def one(self, http: httpx.AsyncClient, i: int) -> None:
        kind = i % 10
        key = {7: LIMITED_KEY, 8: BOB}.get(kind, ALICE)
        body = {"model": MODEL, "prompt": f"request {i} says hello", "max_tokens": 8}
        if kind == 5:
            body["max_tokens"] = 100_000  # over the tenant's limit: 400 after auth
        if kind == 6:
            body["model"] = "no-such-model"  # 404 after auth
        headers = {"Authorization": f"Bearer {'sk-wrong' if kind == 9 else key}"}
        r = await http.post(f"{self.url}/v1/completions", json=body, headers=headers)
        if r.status_code == 401:
            return  # no tenant: no row
        self.outcomes[STATUS_OUTCOME.get(r.status_code, "failed")] += 1
        if r.status_code == 200:
            self.ok_ids.add(r.json()["id"].removeprefix("cmpl-"))

    async def run(
        self, count: int, start: int = 0, concurrency: int = 8, until: asyncio.Event | None = None
    ) -> None:
        """``count`` requests, or (with ``until``) as many as are sent before it is set."""
        queue = iter(range(start, start + count)) if until is None else _until(start, until)
        async with httpx.AsyncClient(timeout=60) as http:

            async def worker() -> None:
                for i in queue:
                    await self.one(http, i)

            await asyncio.gather(*(worker() for _ in range(concurrency)))


def _until(start: int, stop: asyncio.Event) -> Iterator[int]:
    i = start
    while not stop.is_set():
        yield i
        i += 1


async def wait_for_rows(dsn: str, expected: Counter[str], timeout_s: float = 60.0) -> Counter[str]:
    deadline = time.monotonic() + timeout_s
    seen = Counter()
    while time.monotonic() < deadline:
        seen = await ledger_outcomes(dsn)
        if seen == expected:
            return seen
        await asyncio.sleep(0.25)
    return seen


async def reports_by_router(url: str, path: str, tries: int = 40) -> dict[str, dict]:
    by_router: dict[str, dict] = {}
    async with httpx.AsyncClient(timeout=30) as http:
        for _ in range(tries):
            body = (await http.get(f"{url}{path}", headers=ADMIN)).json()
            by_router[body.pop("router")] = body
            if len(by_router) >= 2:
                break
    return by_router


async def test_either_router_reports_the_same_totals(cluster: dict) -> None:
    client = Client(cluster["url"])
    began = time.time()
    await client.run(120)
    assert await wait_for_rows(cluster["dsn"], client.outcomes) == client.outcomes
    assert await ledger_ok_ids(cluster["dsn"]) >= client.ok_ids
    window = f"from={began - 1:.3f}&to={time.time() + 1:.3f}"
    slas = await reports_by_router(cluster["url"], f"/admin/sla?{window}")
    assert len(slas) == 2, list(slas)
    first, second = slas.values()
    assert first == second and first["source"] == "ledger"
    assert sum(t["requests"] for t in first["tenants"]) == sum(client.outcomes.values())
    assert sum(t["ok"] for t in first["tenants"]) == client.outcomes["ok"]
    usages = await reports_by_router(cluster["url"], f"/admin/usage?{window}&bucket_width=1h")
    a, b = usages.values()
    assert a == b and a["requests"] == sum(client.outcomes.values())


async def test_a_tenant_reads_only_its_own_rows_and_bad_input_is_refused(cluster: dict) -> None:
    url, alice = cluster["url"], {"Authorization": f"Bearer {ALICE}"}
    day = f"from={time.time() - 86400:.0f}&to={time.time() + 1:.0f}"
    async with httpx.AsyncClient(timeout=30) as http:
        mine = (await http.get(f"{url}/v1/tenants/alice/usage?{day}", headers=alice)).json()
        assert mine["source"] == "ledger" and mine["requests"] > 0
        assert {r["tenant_id"] for b in mine["data"] for r in b["results"]} == {"alice"}
        sla = (await http.get(f"{url}/v1/tenants/me/sla?{day}", headers=alice)).json()
        assert [t["tenant_id"] for t in sla["tenants"]] == ["alice"]
        csv = await http.get(f"{url}/v1/tenants/alice/usage?{day}&format=csv", headers=alice)
        assert csv.headers["content-type"].startswith("text/csv")
        assert "alice" in csv.text and "bob" not in csv.text
        for path, status, code in [
            ("/v1/tenants/bob/usage", 404, "tenant_not_found"),
            ("/v1/tenants/bob/sla", 404, "tenant_not_found"),
            ("/v1/tenants/me/usage?tenant_id=bob", 404, "tenant_not_found"),
            ("/v1/tenants/alice/sla?from=last-week", 400, "invalid_time"),
            ("/v1/tenants/alice/usage?from=2020-01-01&to=2025-01-01", 400, "time_range_too_large"),
            ("/v1/tenants/alice/usage?from=2025-01-02&to=2025-01-01", 400, "invalid_time_range"),
            ("/v1/tenants/alice/usage?bucket_width=7m", 400, "invalid_bucket"),
        ]:
            r = await http.get(f"{url}{path}", headers=alice)
            assert r.status_code == status and r.json()["error"]["code"] == code, (path, r.text)
        assert (await http.get(f"{url}/admin/usage", headers=alice)).status_code == 403


async def test_an_outage_under_load_loses_nothing_and_counts_once(cluster: dict) -> None:
    """PostgreSQL away for 4 s while clients send: the routers spill, say so on /health, replay.
    The load lasts until the outage ends: with a fixed count it could end before the outage began
    (300 requests take ~1.5 s on a quiet box), and a writer with nothing to write never fails, so
    /health never said "spilling" (the test's flake)."""
    proxy, dsn = cluster["proxy"], cluster["dsn"]
    before = await ledger_outcomes(dsn)
    client = Client(cluster["url"])
    states: set[str] = set()
    over = asyncio.Event()

    async def outage() -> None:
        await asyncio.sleep(1.5)
        proxy.stop()
        async with httpx.AsyncClient(timeout=10) as http:
            end = time.monotonic() + 4.0
            while time.monotonic() < end:
                states.add((await http.get(f"{cluster['url']}/health")).json()["ledger"])
                await asyncio.sleep(0.2)
        proxy.start()
        over.set()

    await asyncio.gather(client.run(0, start=10_000, until=over), outage())
    assert sum(client.outcomes.values()) > 0
    assert "spilling" in states, states
    expected = before + client.outcomes
    assert await wait_for_rows(dsn, expected) == expected
    assert await ledger_ok_ids(dsn) >= client.ok_ids


async def test_a_router_restart_during_an_outage_loses_nothing(cluster: dict) -> None:
    proxy, dsn = cluster["proxy"], cluster["dsn"]
    before = await ledger_outcomes(dsn)
    proxy.stop()
    client = Client(cluster["url"])
    await client.run(60, start=20_000)
    await asyncio.to_thread(cluster["redeploy"])  # new routers; the old ones spill what they hold
    proxy.start()
    expected = before + client.outcomes
    assert await wait_for_rows(dsn, expected, timeout_s=90) == expected
    assert await ledger_ok_ids(dsn) >= client.ok_ids


def spilled_lines(folder: Path, pattern: str = "ledger-spill-*.jsonl") -> int:
    return sum(len(p.read_bytes().splitlines()) for p in folder.glob(pattern))


def busiest_spiller(folder: Path) -> tuple[str, list[Path]]:
    """The router whose spill files hold the most rows (files are ``ledger-spill-<app>-<router
    replica id>-<token>-<n>.jsonl``), and its files."""
    by_router: dict[str, list[Path]] = {}
    for path in folder.glob(f"ledger-spill-{APP}-*.jsonl"):
        router = path.stem.removeprefix(f"ledger-spill-{APP}-").rsplit("-", 2)[0]
        by_router.setdefault(router, []).append(path)
    return max(by_router.items(), key=lambda item: sum(spilled_lines(p.parent, p.name) for p in item[1]))


def kill_router(replica_id: str) -> None:
    """``ray.kill`` of a router replica's actor: its process ends at once (no close, no flush, its
    file locks released by the kernel), as a kill -9 would; Serve starts another."""
    name = f"SERVE_REPLICA::{APP}#Router#{replica_id}"
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)


async def test_a_router_killed_mid_spill_loses_no_spilled_row(cluster: dict) -> None:
    """Issue 43: a router killed outright while the database is away. What it had spilled is on disk
    under a lock that dies with it; once the database is back, a router adopts the file and every
    request it served is one row. (Rows still in memory at a kill are lost by design; the test kills
    once both routers' spool has put every row on disk, at most 200 ms after the last answer.)"""
    proxy, dsn, spill = cluster["proxy"], cluster["dsn"], cluster["spill"]
    before = await ledger_outcomes(dsn)
    proxy.stop()
    client = Client(cluster["url"])
    await client.run(80, start=30_000)
    served = sum(client.outcomes.values())
    async with asyncio.timeout(30):
        while spilled_lines(spill) < served:
            await asyncio.sleep(0.05)
    router, files = busiest_spiller(spill)
    await asyncio.to_thread(kill_router, router)
    assert sum(spilled_lines(spill, p.name) for p in files) > 0  # its rows outlived it, on disk
    proxy.start()
    expected = before + client.outcomes
    assert await wait_for_rows(dsn, expected, timeout_s=90) == expected
    assert await ledger_ok_ids(dsn) >= client.ok_ids
    async with asyncio.timeout(30):  # adopted by a live router, replayed, then deleted
        while any(p.exists() for p in files):
            await asyncio.sleep(0.05)
