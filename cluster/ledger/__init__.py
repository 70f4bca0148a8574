"""The durable per-request ledger: one row per finished request, in PostgreSQL or SQLite."""
