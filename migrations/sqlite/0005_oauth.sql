-- OAuth 2.x upstream credentials. A credential with an `oauth` document
-- (token URL, client id, scopes, audience, grant) gets its bearer token from
-- an authorization server; its `sealed` secret is then a sealed JSON object
-- holding the client secret and/or the refresh token (rotated in place).
ALTER TABLE credentials ADD COLUMN oauth TEXT;

-- The last access token per OAuth credential, sealed, so a restart or a
-- snapshot reload does not cost a token request.
CREATE TABLE oauth_tokens (
    credential TEXT PRIMARY KEY,
    sealed     BLOB NOT NULL,
    expires_at INTEGER -- unix milliseconds; NULL: the server gave no lifetime
);
