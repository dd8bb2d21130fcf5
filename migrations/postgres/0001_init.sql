-- tessera's schema (Postgres): upstream credentials, callers, and the
-- connections that bind one caller to one credential. Secrets are sealed
-- (AEAD) blobs; caller tokens are stored only as SHA-256 digests. The
-- versions and meaning follow migrations/sqlite/ one for one.

CREATE TABLE credentials (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    upstream    TEXT NOT NULL,
    scheme      TEXT NOT NULL CHECK (scheme IN ('bearer', 'basic', 'header')),
    header_name TEXT,
    username    TEXT,
    sealed      BYTEA NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE TABLE callers (
    id           BIGSERIAL PRIMARY KEY,
    name         TEXT NOT NULL UNIQUE,
    token_sha256 BYTEA NOT NULL UNIQUE,
    created_at   BIGINT NOT NULL,
    revoked_at   BIGINT
);

CREATE TABLE connections (
    id            TEXT PRIMARY KEY,
    caller_id     BIGINT NOT NULL REFERENCES callers (id),
    credential_id BIGINT NOT NULL REFERENCES credentials (id),
    created_at    BIGINT NOT NULL,
    revoked_at    BIGINT
);

-- One row, bumped in the same transaction as every change.
CREATE TABLE revision (
    id    BIGINT PRIMARY KEY CHECK (id = 1),
    value BIGINT NOT NULL
);
INSERT INTO revision (id, value) VALUES (1, 0);
