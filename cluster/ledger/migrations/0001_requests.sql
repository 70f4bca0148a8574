-- One row per finished request, written once (request_id is the key: a replayed row is ignored).
-- Portable SQL: PostgreSQL and SQLite read it alike. Times are unix seconds (double precision), so
-- both databases compare and bucket them the same way.
CREATE TABLE ledger_requests (
    request_id      TEXT PRIMARY KEY,
    app             TEXT NOT NULL,
    router          TEXT NOT NULL,
    tenant_id       TEXT NOT NULL,
    api_key_id      TEXT NOT NULL,
    model           TEXT NOT NULL,
    sla_class       TEXT NOT NULL,
    arrival         DOUBLE PRECISION NOT NULL,
    ended           DOUBLE PRECISION NOT NULL,
    queue_wait_s    DOUBLE PRECISION,
    ttft_s          DOUBLE PRECISION,
    tpot_s          DOUBLE PRECISION,
    itl_p99_s       DOUBLE PRECISION,
    e2e_s           DOUBLE PRECISION,
    prompt_tokens   BIGINT NOT NULL,
    cached_tokens   BIGINT NOT NULL,
    output_tokens   BIGINT NOT NULL,
    outcome         TEXT NOT NULL,
    reason          TEXT,
    replica_seconds DOUBLE PRECISION NOT NULL,
    cost_usd        DOUBLE PRECISION NOT NULL
);
-- Every report reads a time range (of one app, or of one tenant); retention deletes by time.
CREATE INDEX ledger_requests_app_arrival ON ledger_requests (app, arrival);
CREATE INDEX ledger_requests_tenant_arrival ON ledger_requests (tenant_id, arrival);
