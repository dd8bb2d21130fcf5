-- Approvals that learn (issue 26, src/authz/predict/): a person's answers
-- are the evidence a prediction is made from.
-- An approval now keeps the credential of its connection and the shape of
-- its call's arguments (names and JSON types, never values), so that its
-- answer can be counted per (caller, credential, tool, shape).
ALTER TABLE approvals ADD COLUMN credential TEXT;
ALTER TABLE approvals ADD COLUMN shape TEXT;
-- One row per answer a person gave (a pending approval granted or denied),
-- written in the transaction that decides it. Calls tessera allowed or
-- denied by prediction are never written here.
CREATE TABLE approval_evidence (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at         INTEGER NOT NULL,        -- unix milliseconds
    caller     TEXT NOT NULL,
    credential TEXT,                    -- NULL: answered before this migration
    tool       TEXT NOT NULL,
    shape      TEXT,                    -- NULL: answered before this migration
    answer     TEXT NOT NULL CHECK (answer IN ('grant', 'deny')),
    approval   TEXT
);
CREATE INDEX approval_evidence_caller_tool ON approval_evidence (caller, tool);
-- The answers already given count (at the (caller, tool) and (tool) levels:
-- their credential and shape were not kept). A grant later used, revoked or
-- expired was still a grant; a pending approval that expired unanswered
-- (no decided_at) was no answer.
INSERT INTO approval_evidence (at, caller, tool, answer, approval)
SELECT decided_at, caller, tool, CASE WHEN status = 'denied' THEN 'deny' ELSE 'grant' END, id
FROM approvals
WHERE rpc_method = 'tools/call' AND tool <> '' AND decided_at IS NOT NULL
  AND status IN ('granted', 'used', 'revoked', 'expired', 'denied')
ORDER BY decided_at, id;
-- Moves when evidence is forgotten (`tessera approval forget`): a serving
-- process then reads the evidence again whole rather than only what is new.
CREATE TABLE evidence_state (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    generation BIGINT NOT NULL
);
INSERT INTO evidence_state (id, generation) VALUES (1, 0);
-- Calls denied by prediction: the same call again is held for a person
-- rather than denied again (a person can always still be asked).
CREATE TABLE predicted_denials (
    caller           TEXT NOT NULL,
    connection       TEXT NOT NULL,
    tool             TEXT NOT NULL,
    arguments_sha256 TEXT NOT NULL,
    at               BIGINT NOT NULL,   -- unix milliseconds
    PRIMARY KEY (caller, connection, tool, arguments_sha256)
);
-- Rows older than --approval-ttl no longer count and are pruned as new ones
-- are written.
CREATE INDEX predicted_denials_at ON predicted_denials (at);
