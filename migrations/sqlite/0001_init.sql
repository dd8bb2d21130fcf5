-- tessera's schema: upstream credentials, callers, and the connections that
-- bind one caller to one credential. Secrets are sealed (AEAD) blobs; caller
-- tokens are stored only as SHA-256 digests.

CREATE TABLE credentials (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    name        TEXT NOT NULL UNIQUE,
    upstream    TEXT NOT NULL,
    scheme      TEXT NOT NULL CHECK (scheme IN ('bearer', 'basic', 'header')),
    header_name TEXT,
    username    TEXT,
    sealed      BLOB NOT NULL,
    created_at  INTEGER NOT NULL
);

CREATE TABLE callers (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    name         TEXT NOT NULL UNIQUE,
    token_sha256 BLOB NOT NULL UNIQUE,
    created_at   INTEGER NOT NULL,
    revoked_at   INTEGER
);

CREATE TABLE connections (
    id            TEXT PRIMARY KEY,
    caller_id     INTEGER NOT NULL REFERENCES callers (id),
    credential_id INTEGER NOT NULL REFERENCES credentials (id),
    created_at    INTEGER NOT NULL,
    revoked_at    INTEGER
);

-- One row, bumped in the same transaction as every change. A serving process
-- polls this single integer and reloads its snapshot only when it moved.
CREATE TABLE revision (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    value INTEGER NOT NULL
);
INSERT INTO revision (id, value) VALUES (1, 0);
