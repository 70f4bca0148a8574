-- The hourly rollup (docs/ledger.md, "The hourly rollup"): month-scale reports read these sums and
-- latency histograms instead of every row. A background job (rollup_job.py) rebuilds an hour from
-- ledger_requests once it has closed; the writer marks each hour it stored rows in as dirty, in the
-- statement that stores them, so an hour with rows is always either dirty or rolled up whole.
CREATE TABLE ledger_rollup (
    app             TEXT NOT NULL,
    hour            BIGINT NOT NULL,
    tenant_id       TEXT NOT NULL,
    api_key_id      TEXT NOT NULL,
    model           TEXT NOT NULL,
    sla_class       TEXT NOT NULL,
    outcome         TEXT NOT NULL,
    requests        BIGINT NOT NULL,
    prompt_tokens   BIGINT NOT NULL,
    cached_tokens   BIGINT NOT NULL,
    output_tokens   BIGINT NOT NULL,
    met             BIGINT NOT NULL,
    cost_usd        DOUBLE PRECISION NOT NULL,
    replica_seconds DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (app, hour, tenant_id, api_key_id, model, sla_class, outcome)
);
CREATE INDEX ledger_rollup_tenant_hour ON ledger_rollup (tenant_id, hour);
-- Successful rows' latencies per (hour, tenant, model, class, metric): log bins, hex-encoded pairs
-- (latency_bins.py), merged by adding counts.
CREATE TABLE ledger_rollup_latency (
    app       TEXT NOT NULL,
    hour      BIGINT NOT NULL,
    tenant_id TEXT NOT NULL,
    model     TEXT NOT NULL,
    sla_class TEXT NOT NULL,
    metric    TEXT NOT NULL,
    samples   BIGINT NOT NULL,
    bins      TEXT NOT NULL,
    PRIMARY KEY (app, hour, tenant_id, model, sla_class, metric)
);
CREATE INDEX ledger_rollup_latency_tenant_hour ON ledger_rollup_latency (tenant_id, hour);
-- Hours with rows stored since they were last rolled up, one mark per router (routers never wait
-- on each other's mark); each store into a marked hour adds 1 to its version.
CREATE TABLE ledger_rollup_dirty (
    app       TEXT NOT NULL,
    hour      BIGINT NOT NULL,
    router    TEXT NOT NULL,
    version   BIGINT NOT NULL,
    marked_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (app, hour, router)
);
-- Hours rolled up, and under which SLA targets their met counts were counted.
CREATE TABLE ledger_rollup_hours (
    app       TEXT NOT NULL,
    hour      BIGINT NOT NULL,
    targets   TEXT NOT NULL,
    rolled_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (app, hour)
);
-- Rows stored before this migration: every hour of theirs is dirty, so the job rolls them up.
INSERT INTO ledger_rollup_dirty (app, hour, router, version, marked_at)
SELECT DISTINCT app, CAST(floor(arrival / 3600) * 3600 AS BIGINT), router, 1, 0.0 FROM ledger_requests
