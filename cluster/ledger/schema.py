"""The ledger tables as SQLAlchemy sees them, for inserts and queries (``migrations/`` creates them)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Float, MetaData, Table, Text

metadata = MetaData()

requests = Table(
    "ledger_requests",
    metadata,
    Column("request_id", Text, primary_key=True),
    Column("app", Text, nullable=False),
    Column("router", Text, nullable=False),
    Column("tenant_id", Text, nullable=False),
    Column("api_key_id", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("sla_class", Text, nullable=False),
    Column("arrival", Float(precision=53), nullable=False),
    Column("ended", Float(precision=53), nullable=False),
    Column("queue_wait_s", Float(precision=53)),
    Column("ttft_s", Float(precision=53)),
    Column("tpot_s", Float(precision=53)),
    Column("itl_p99_s", Float(precision=53)),
    Column("e2e_s", Float(precision=53)),
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("cached_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("reason", Text),
    Column("replica_seconds", Float(precision=53), nullable=False),
    Column("cost_usd", Float(precision=53), nullable=False),
    Column("adapter", Text),  # migrations/0003_adapter.sql
)

# The hourly rollup (migrations/0002_rollup.sql).
rollup = Table(
    "ledger_rollup",
    metadata,
    Column("app", Text, primary_key=True),
    Column("hour", BigInteger, primary_key=True),
    Column("tenant_id", Text, primary_key=True),
    Column("api_key_id", Text, primary_key=True),
    Column("model", Text, primary_key=True),
    Column("sla_class", Text, primary_key=True),
    Column("outcome", Text, primary_key=True),
    Column("requests", BigInteger, nullable=False),
    Column("prompt_tokens", BigInteger, nullable=False),
    Column("cached_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("met", BigInteger, nullable=False),
    Column("cost_usd", Float(precision=53), nullable=False),
    Column("replica_seconds", Float(precision=53), nullable=False),
)

rollup_latency = Table(
    "ledger_rollup_latency",
    metadata,
    Column("app", Text, primary_key=True),
    Column("hour", BigInteger, primary_key=True),
    Column("tenant_id", Text, primary_key=True),
    Column("model", Text, primary_key=True),
    Column("sla_class", Text, primary_key=True),
    Column("metric", Text, primary_key=True),
    Column("samples", BigInteger, nullable=False),
    Column("bins", Text, nullable=False),
)

rollup_dirty = Table(
    "ledger_rollup_dirty",
    metadata,
    Column("app", Text, primary_key=True),
    Column("hour", BigInteger, primary_key=True),
    Column("router", Text, primary_key=True),
    Column("version", BigInteger, nullable=False),
    Column("marked_at", Float(precision=53), nullable=False),
)

rollup_hours = Table(
    "ledger_rollup_hours",
    metadata,
    Column("app", Text, primary_key=True),
    Column("hour", BigInteger, primary_key=True),
    Column("targets", Text, nullable=False),
    Column("rolled_at", Float(precision=53), nullable=False),
)
