-- Tool pinning (issue 29, src/authz/pins.rs): per credential (one upstream
-- identity), the definition of each tool an admin accepted (or that was
-- trusted on first use) and the one last offered, each as canonical JSON
-- with its SHA-256. A tools/list answer whose tool differs from its pin
-- (or has none) is filtered and the tool's calls refused until an admin
-- accepts it.
CREATE TABLE tool_pins (
    credential         TEXT NOT NULL,   -- the credential's name
    tool               TEXT NOT NULL,   -- the tool's name, exactly as listed
    status             TEXT NOT NULL CHECK (status IN ('pinned', 'changed', 'new', 'rejected')),
    pinned_digest      TEXT,            -- NULL: never accepted
    pinned_definition  TEXT,
    offered_digest     TEXT,            -- the digest last seen in a tools/list answer
    offered_definition TEXT,
    first_seen         BIGINT NOT NULL, -- unix milliseconds
    last_seen          BIGINT NOT NULL, -- unix milliseconds: last time a new digest was recorded
    PRIMARY KEY (credential, tool)
);
