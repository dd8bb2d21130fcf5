-- Approvals: calls an @ask policy (or the external authorizer) holds for a
-- person. One row per distinct call (caller, connection, method, tool and a
-- SHA-256 of the canonical arguments; '' where a call has none), so a
-- retried call finds its row. A grant allows that exact call until
-- expires_at, uses_left times; a denial stays on record.
CREATE TABLE approvals (
    id               TEXT PRIMARY KEY,
    created_at       INTEGER NOT NULL, -- unix milliseconds
    caller           TEXT NOT NULL,
    connection       TEXT NOT NULL,
    rpc_method       TEXT NOT NULL,
    tool             TEXT NOT NULL,
    arguments_sha256 TEXT NOT NULL,
    arguments        TEXT,             -- only with --audit-arguments
    reason           TEXT,             -- the @ask policies or the authorizer's reason
    status           TEXT NOT NULL CHECK (status IN ('pending', 'granted', 'denied')),
    decided_at       INTEGER,
    expires_at       INTEGER,          -- a grant's end, unix milliseconds
    uses_left        INTEGER           -- a grant's remaining uses
);
CREATE INDEX approvals_call ON approvals (caller, connection, rpc_method, tool, arguments_sha256);
-- At most one pending request per call, even when requests race.
CREATE UNIQUE INDEX approvals_one_pending
    ON approvals (caller, connection, rpc_method, tool, arguments_sha256) WHERE status = 'pending';
CREATE INDEX approvals_status ON approvals (status, created_at);

-- The audit trail records 'ask' verdicts too. SQLite cannot change a CHECK
-- constraint in place: rebuild the table, keeping every row.
CREATE TABLE audit_v2 (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    at               INTEGER NOT NULL,
    caller           TEXT NOT NULL,
    connection       TEXT NOT NULL,
    http_method      TEXT NOT NULL,
    rpc_method       TEXT,
    tool             TEXT,
    verdict          TEXT NOT NULL CHECK (verdict IN ('allow', 'deny', 'ask')),
    reason           TEXT,
    arguments_sha256 TEXT,
    arguments        TEXT,
    status           INTEGER NOT NULL,
    duration_us      INTEGER NOT NULL
);
INSERT INTO audit_v2 SELECT * FROM audit;
DROP TABLE audit;
ALTER TABLE audit_v2 RENAME TO audit;
CREATE INDEX audit_at ON audit (at);
