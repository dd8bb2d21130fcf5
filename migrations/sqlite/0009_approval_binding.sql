-- Approvals are bound to the whole call as it reaches the upstream: the key
-- (arguments_sha256, now 'v2:' and a SHA-256 of sub-path, query, session
-- and the complete canonical params; see src/approvals.rs) is unchanged in
-- shape, and these columns show the approver what it binds. NULL on rows
-- recorded before: a pending one is filled in when its call next asks.
ALTER TABLE approvals ADD COLUMN sub_path TEXT;  -- '' when none
ALTER TABLE approvals ADD COLUMN query TEXT;     -- NULL when none
ALTER TABLE approvals ADD COLUMN session TEXT;   -- a fingerprint of Mcp-Session-Id, '' when none
ALTER TABLE approvals ADD COLUMN params TEXT;    -- canonical params, only with --audit-arguments
-- --max-pending-approvals counts a caller's pending approvals on every held
-- call that would record a new one.
CREATE INDEX approvals_pending_caller ON approvals (caller) WHERE status = 'pending';
