-- Approvals are bound to the whole call as it reaches the upstream; see
-- migrations/sqlite/0009_approval_binding.sql.
ALTER TABLE approvals ADD COLUMN sub_path TEXT;
ALTER TABLE approvals ADD COLUMN query TEXT;
ALTER TABLE approvals ADD COLUMN session TEXT;
ALTER TABLE approvals ADD COLUMN params TEXT;
CREATE INDEX approvals_pending_caller ON approvals (caller) WHERE status = 'pending';
