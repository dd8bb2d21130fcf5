-- The audit trail: one row per authorization decision. Names and ids,
-- never a credential or a caller token; tool arguments only as a SHA-256
-- unless serve runs with --audit-arguments.
CREATE TABLE audit (
    id               BIGSERIAL PRIMARY KEY,
    at               BIGINT NOT NULL, -- unix milliseconds
    caller           TEXT NOT NULL,
    connection       TEXT NOT NULL,
    http_method      TEXT NOT NULL,
    rpc_method       TEXT,
    tool             TEXT,
    verdict          TEXT NOT NULL CHECK (verdict IN ('allow', 'deny')),
    reason           TEXT,
    arguments_sha256 TEXT,
    arguments        TEXT,
    status           BIGINT NOT NULL,
    duration_us      BIGINT NOT NULL
);
CREATE INDEX audit_at ON audit (at);
