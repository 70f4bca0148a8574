"""Fixtures of the ledger tests: a real PostgreSQL (a fresh database per test) and an SQLite file."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from tests.cluster.ledger.postgres_server import ENV, configured_dsn, reachable, start_local


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A reachable PostgreSQL server's DSN: the configured one, else one started here, else skip."""
    dsn = configured_dsn()
    if reachable(dsn):
        yield dsn
        return
    server = start_local()
    if server is None:
        pytest.skip(f"no PostgreSQL at {dsn} ({ENV}) and initdb/pg_ctl could not start one here")
    try:
        yield server.dsn
    finally:
        server.stop(remove=True)


def _with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{name}"))


async def _admin(dsn: str, statement: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture
def pg_dsn(pg_server: str) -> Iterator[str]:
    """A database of its own for one test, dropped after."""
    name = f"fl_ledger_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(pg_server, f"CREATE DATABASE {name}"))
    try:
        yield _with_database(pg_server, name)
    finally:
        asyncio.run(_admin(pg_server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture
def sqlite_dsn(tmp_path: Path) -> str:
    return str(tmp_path / "ledger.sqlite")


@pytest.fixture(params=["postgresql", "sqlite"])
def dsn(request: pytest.FixtureRequest) -> str:
    """Each test that takes it runs on both databases."""
    name = "pg_dsn" if request.param == "postgresql" else "sqlite_dsn"
    return request.getfixturevalue(name)
