"""Where ledger rows live: PostgreSQL (a DSN) or an SQLite file, behind one SQLAlchemy async engine.

In a router every call runs on the ledger's thread (``db_thread.py``), whose loop owns the engine's
connections (a CLI or a test may use a store from its own loop).

Both databases get the same table (``migrations/``), the same insert (``ON CONFLICT DO NOTHING`` on
the request id, so a row replayed after an outage or sent twice is stored once) and the same
queries; only the driver differs (asyncpg, aiosqlite).
"""

from __future__ import annotations

import asyncio
import fcntl
import math
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from cluster.ledger.rows import LedgerRow
from cluster.ledger.schema import requests

MIGRATIONS = Path(__file__).parent / "migrations"
COLUMNS = tuple(c.name for c in requests.columns)  # a row's fields, in the table's order
HOUR = 3600
# SQLite: the rows as plain tuples, one executemany in the driver's C, then the dirty marks of their
# hours: 32.5 µs of CPU a row on the CPU box against 57.8 through SQLAlchemy's insert
# (bench/ledger_sqlite_insert.py). A router writes a row per request.
SQLITE_INSERT = (
    f"INSERT INTO ledger_requests ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
    "ON CONFLICT (request_id) DO NOTHING"
)
SQLITE_MARK = (
    "INSERT INTO ledger_rollup_dirty (app, hour, router, version, marked_at) VALUES (?, ?, ?, 1, ?) "
    "ON CONFLICT (app, hour, router) DO UPDATE "
    "SET version = ledger_rollup_dirty.version + 1, marked_at = excluded.marked_at"
)
# Rows go in by COPY (thousands a statement, encoded by asyncpg in C) into a temporary table of the
# connection's own, then into the ledger with ``ON CONFLICT DO NOTHING``: COPY alone cannot skip a
# request id already stored, and a replay must store each row once. The staging table has the
# ledger's columns and no key (a chunk may repeat an id); its rows go at the commit.
PG_STAGE = "ledger_requests_stage"
PG_CREATE_STAGE = f"CREATE TEMP TABLE IF NOT EXISTS {PG_STAGE} (LIKE ledger_requests) ON COMMIT DELETE ROWS"
# The staged rows, and in the same statement a dirty mark on each (app, hour, router) a row was
# actually inserted into (RETURNING: a replayed row marks nothing), for the rollup job
# (rollup_job.py). A mark that exists gets its version raised: the job clears only the version it
# saw before rebuilding.
PG_MERGE = (
    f"WITH stored AS (INSERT INTO ledger_requests ({', '.join(COLUMNS)}) "
    f"SELECT {', '.join(COLUMNS)} FROM {PG_STAGE} "
    "ON CONFLICT (request_id) DO NOTHING RETURNING app, router, arrival) "
    "INSERT INTO ledger_rollup_dirty (app, hour, router, version, marked_at) "
    f"SELECT DISTINCT app, CAST(floor(arrival / {HOUR}) * {HOUR} AS BIGINT), router, 1, $1::float8 "
    "FROM stored ON CONFLICT (app, hour, router) DO UPDATE "
    "SET version = ledger_rollup_dirty.version + 1, marked_at = excluded.marked_at"
)
# Any constant: routers starting together take it, so one applies the migrations and the rest wait.
MIGRATION_LOCK = 0x6661_6972_6C65  # "fairle"
CONNECT_TIMEOUT_S = 2.0  # an unreachable database is an outage to spill through, not a long hang
COMMAND_TIMEOUT_S = 120.0  # the longest report query (a month of rows takes seconds)
SQLITE_BUSY_MS = 10_000  # routers on one machine share the file: a writer waits its turn


def engine_url(dsn: str) -> str:
    """A SQLAlchemy async URL from a DSN (``postgresql://...``) or an SQLite file path."""
    if "://" not in dsn:
        return f"sqlite+aiosqlite:///{Path(dsn).expanduser()}"
    url = make_url(dsn)
    if url.drivername in ("postgresql", "postgres", "postgresql+psycopg2", "postgresql+psycopg"):
        url = url.set(drivername="postgresql+asyncpg")
    elif url.drivername == "sqlite":
        url = url.set(drivername="sqlite+aiosqlite")
    return url.render_as_string(hide_password=False)


def redact(dsn: str) -> str:
    """The DSN without its password (for logs and /health)."""
    if "://" not in dsn:
        return dsn
    return make_url(dsn).render_as_string(hide_password=True)


def make_engine(dsn: str) -> AsyncEngine:
    url = engine_url(dsn)
    if url.startswith("sqlite"):
        wal_mode(Path(make_url(url).database or ""))
        engine = create_async_engine(url, connect_args={"timeout": SQLITE_BUSY_MS / 1000})
        _sqlite_transactions(engine)
        return engine
    return create_async_engine(
        url,
        pool_size=4,
        pool_pre_ping=True,
        connect_args={"timeout": CONNECT_TIMEOUT_S, "command_timeout": COMMAND_TIMEOUT_S},
    )


def wal_mode(path: Path) -> None:
    """Create the file in WAL mode, once, under a file lock. WAL persists in the file; switching a
    file to it while another connection holds a transaction can deadlock until a busy timeout, so
    routers starting together take turns here (a blocking moment at start, never later)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = sqlite3.connect(path, timeout=SQLITE_BUSY_MS / 1000)
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
        finally:
            conn.close()


def _sqlite_transactions(engine: AsyncEngine) -> None:
    """BEGIN IMMEDIATE (a transaction takes the write lock at its start, so two routers never deadlock
    upgrading a read lock); with WAL, readers never block the writers of other routers."""

    @event.listens_for(engine.sync_engine, "connect")
    def _connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _begin(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def row_values(row: LedgerRow) -> tuple:
    """A row's fields as the drivers take them: a plain tuple in the table's column order."""
    return tuple(getattr(row, name) for name in COLUMNS)


def migration_files() -> list[tuple[int, str]]:
    """(version, SQL) of every numbered migration, in order."""
    out = []
    for path in sorted(MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.sql")):
        out.append((int(path.name[:4]), path.read_text(encoding="utf-8")))
    return out


def statements(sql: str) -> list[str]:
    """The statements of a migration file (no semicolons inside statements, comments dropped)."""
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


class LedgerStore:
    """The ledger database: migrate, insert rows idempotently, delete old rows, run queries."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        # A PostgreSQL insert still running past this is cut (the connection terminated): a cancel
        # alone waits for asyncpg to drain the COPY through the network, which is what is slow.
        self.insert_timeout_s: float | None = None
        self.engine = make_engine(dsn)
        self.dialect = self.engine.dialect.name  # "postgresql" or "sqlite"

    async def close(self) -> None:
        await self.engine.dispose()

    async def migrate(self) -> int:
        """Apply the migrations not yet applied; the schema version after. Safe when several routers
        start together: one transaction under a lock (an advisory lock in PostgreSQL, the write lock
        of BEGIN IMMEDIATE in SQLite), so each migration runs exactly once."""
        async with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
            await conn.execute(
                text(
                    "CREATE TABLE IF NOT EXISTS schema_version "
                    "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
                )
            )
            current = (await conn.execute(text("SELECT MAX(version) FROM schema_version"))).scalar() or 0
            for version, sql in migration_files():
                if version <= current:
                    continue
                for statement in statements(sql):
                    await conn.execute(text(statement))
                await conn.execute(
                    text("INSERT INTO schema_version (version, applied_at) VALUES (:v, :t)"),
                    {"v": version, "t": time.time()},
                )
                current = version
        return current

    async def insert(self, rows: Sequence[LedgerRow]) -> None:
        """Store ``rows``; a request id already stored is left as it is."""
        if not rows:
            return
        if self.dialect == "postgresql":
            await self._insert_pg(rows)
            return
        # SQLite cannot say which rows of an executemany went in: every batch row's hour is
        # marked (a replay may re-roll an hour for nothing, never miss one). One writer at a time:
        # the transaction is BEGIN IMMEDIATE (``_sqlite_transactions``).
        now = time.time()
        records = [row_values(r) for r in rows]
        marks = {(r.app, math.floor(r.arrival / HOUR) * HOUR, r.router, now) for r in rows}
        async with self.engine.begin() as conn:
            raw = (await conn.get_raw_connection()).driver_connection  # aiosqlite's connection
            await raw.executemany(SQLITE_INSERT, records)
            await raw.executemany(SQLITE_MARK, sorted(marks))

    async def _insert_pg(self, rows: Sequence[LedgerRow]) -> None:
        """One transaction: COPY into the staging table, then merge (``PG_MERGE``). The records are
        plain tuples that asyncpg encodes in C; SQLAlchemy's per-row parameters cost ~25 µs a row
        and the 100-row unnest statements before this a round trip each (docs/ledger.md)."""
        records = [row_values(r) for r in rows]
        async with self.engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            if raw.is_in_transaction():  # left open by an insert cancelled mid-way (a timeout)
                await raw.execute("ROLLBACK")
            cut: list[bool] = []
            deadline = self._deadline(raw, cut)
            try:
                async with raw.transaction():
                    await raw.execute(PG_CREATE_STAGE)
                    await raw.copy_records_to_table(PG_STAGE, records=records, columns=COLUMNS)
                    await raw.execute(PG_MERGE, time.time())
            except BaseException as exc:
                # A cancel can cut the transaction's own rollback: the pool must not hand this
                # connection out again half-way through (its pre-ping finds it closed, reconnects).
                raw.terminate()
                if cut:
                    raise TimeoutError(f"insert of {len(rows)} rows cut at the deadline") from exc
                raise
            finally:
                if deadline is not None:
                    deadline.cancel()

    def _deadline(self, raw, cut: list[bool]) -> asyncio.TimerHandle | None:
        if self.insert_timeout_s is None:
            return None

        def terminate() -> None:
            cut.append(True)
            raw.terminate()

        return asyncio.get_running_loop().call_later(self.insert_timeout_s, terminate)

    async def delete_before(self, cutoff: float) -> int:
        """Delete rows that arrived before ``cutoff`` (unix seconds); how many went."""
        async with self.engine.begin() as conn:
            result = await conn.execute(requests.delete().where(requests.c.arrival < cutoff))
        return int(result.rowcount or 0)

    async def count(self, app: str | None = None) -> int:
        query = "SELECT COUNT(*) FROM ledger_requests" + (" WHERE app = :app" if app else "")
        async with self.engine.connect() as conn:
            return int((await conn.execute(text(query), {"app": app})).scalar() or 0)

    def connect(self) -> AsyncConnection:
        """A connection for queries (``async with store.connect() as conn``)."""
        return self.engine.connect()

    async def ping(self, timeout_s: float = CONNECT_TIMEOUT_S) -> bool:
        """Whether the database answers now."""
        try:
            async with asyncio.timeout(timeout_s), self.engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
            return True
        except Exception:
            return False
