"""The ledger table as SQLAlchemy sees it, for inserts and queries (``migrations/`` creates it)."""

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
)
