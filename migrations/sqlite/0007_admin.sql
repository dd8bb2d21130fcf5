-- The admin HTTP API's tokens, stored only as SHA-256 digests, and the trail
-- of admin actions (by token name, or "cli" for the command line).
CREATE TABLE admin_tokens (
    name         TEXT PRIMARY KEY,
    token_sha256 BLOB NOT NULL UNIQUE,
    created_at   INTEGER NOT NULL,
    revoked_at   INTEGER
);

CREATE TABLE admin_audit (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      INTEGER NOT NULL,
    actor   TEXT NOT NULL,
    action  TEXT NOT NULL,
    target  TEXT NOT NULL,
    outcome TEXT NOT NULL -- "ok", or the error the action met
);
