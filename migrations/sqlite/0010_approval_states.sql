-- Approval states made explicit (src/store/model.rs, `Status::next`):
-- pending -> granted | denied | expired; granted -> used | expired | revoked.
-- The held call itself (its complete params) is kept sealed with the master
-- key (`sealed_call`, associated data tessera:approval:<id>), whatever
-- --audit-arguments says; who decided is kept with the decision. A pending
-- approval now ends at expires_at (--approval-ttl, set when it is recorded).
-- SQLite cannot change a CHECK constraint in place: rebuild the table,
-- keeping every row.
CREATE TABLE approvals_v3 (
    id               TEXT PRIMARY KEY,
    created_at       INTEGER NOT NULL,
    caller           TEXT NOT NULL,
    connection       TEXT NOT NULL,
    rpc_method       TEXT NOT NULL,
    tool             TEXT NOT NULL,
    arguments_sha256 TEXT NOT NULL,
    arguments        TEXT,
    reason           TEXT,
    status           TEXT NOT NULL
        CHECK (status IN ('pending', 'granted', 'denied', 'used', 'expired', 'revoked')),
    decided_at       INTEGER,
    expires_at       INTEGER,          -- a pending request's or a grant's end, unix ms
    uses_left        INTEGER,
    sub_path         TEXT,
    query            TEXT,
    session          TEXT,
    params           TEXT,
    sealed_call      BLOB,             -- the complete params, sealed
    decided_by       TEXT              -- the admin token's name, or "cli"
);
INSERT INTO approvals_v3 (id, created_at, caller, connection, rpc_method, tool,
    arguments_sha256, arguments, reason, status, decided_at, expires_at, uses_left,
    sub_path, query, session, params)
SELECT id, created_at, caller, connection, rpc_method, tool, arguments_sha256,
    arguments, reason,
    CASE WHEN status = 'granted' AND uses_left <= 0 THEN 'used' ELSE status END,
    decided_at,
    CASE WHEN status = 'pending' THEN created_at + 86400000 ELSE expires_at END,
    uses_left, sub_path, query, session, params
FROM approvals;
DROP TABLE approvals;
ALTER TABLE approvals_v3 RENAME TO approvals;
CREATE INDEX approvals_call ON approvals (caller, connection, rpc_method, tool, arguments_sha256);
CREATE UNIQUE INDEX approvals_one_pending
    ON approvals (caller, connection, rpc_method, tool, arguments_sha256) WHERE status = 'pending';
CREATE INDEX approvals_status ON approvals (status, created_at);
CREATE INDEX approvals_pending_caller ON approvals (caller) WHERE status = 'pending';

-- Admin tokens have a role: admin (everything) or approver (approvals and
-- the audit trail only).
ALTER TABLE admin_tokens ADD COLUMN role TEXT NOT NULL DEFAULT 'admin'
    CHECK (role IN ('admin', 'approver'));
