-- The admin HTTP API's tokens, stored only as SHA-256 digests, and the trail
-- of admin actions (by token name, or "cli" for the command line).
CREATE TABLE admin_tokens (
    name         TEXT PRIMARY KEY,
    token_sha256 BYTEA NOT NULL UNIQUE,
    created_at   BIGINT NOT NULL,
    revoked_at   BIGINT
);

CREATE TABLE admin_audit (
    id      BIGSERIAL PRIMARY KEY,
    at      BIGINT NOT NULL,
    actor   TEXT NOT NULL,
    action  TEXT NOT NULL,
    target  TEXT NOT NULL,
    outcome TEXT NOT NULL -- 'ok', or the error the action met
);
