-- Approvals: calls an @ask policy (or the external authorizer) holds for a
-- person; see migrations/sqlite/0004_approvals.sql.
CREATE TABLE approvals (
    id               TEXT PRIMARY KEY,
    created_at       BIGINT NOT NULL, -- unix milliseconds
    caller           TEXT NOT NULL,
    connection       TEXT NOT NULL,
    rpc_method       TEXT NOT NULL,
    tool             TEXT NOT NULL,
    arguments_sha256 TEXT NOT NULL,
    arguments        TEXT,
    reason           TEXT,
    status           TEXT NOT NULL CHECK (status IN ('pending', 'granted', 'denied')),
    decided_at       BIGINT,
    expires_at       BIGINT,
    uses_left        BIGINT
);
CREATE INDEX approvals_call ON approvals (caller, connection, rpc_method, tool, arguments_sha256);
-- At most one pending request per call, even when requests race.
CREATE UNIQUE INDEX approvals_one_pending
    ON approvals (caller, connection, rpc_method, tool, arguments_sha256) WHERE status = 'pending';
CREATE INDEX approvals_status ON approvals (status, created_at);

-- The audit trail records 'ask' verdicts too.
ALTER TABLE audit DROP CONSTRAINT audit_verdict_check;
ALTER TABLE audit ADD CONSTRAINT audit_verdict_check CHECK (verdict IN ('allow', 'deny', 'ask'));
