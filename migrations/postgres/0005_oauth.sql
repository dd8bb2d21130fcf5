-- OAuth 2.x upstream credentials: see migrations/sqlite/0005_oauth.sql.
ALTER TABLE credentials ADD COLUMN oauth TEXT;

CREATE TABLE oauth_tokens (
    credential TEXT PRIMARY KEY,
    sealed     BYTEA NOT NULL,
    expires_at BIGINT -- unix milliseconds; NULL: the server gave no lifetime
);
