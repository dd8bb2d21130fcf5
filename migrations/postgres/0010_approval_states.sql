-- Approval states made explicit, the held call sealed, who decided, and
-- admin token roles; see migrations/sqlite/0010_approval_states.sql.
ALTER TABLE approvals DROP CONSTRAINT approvals_status_check;
ALTER TABLE approvals ADD CONSTRAINT approvals_status_check
    CHECK (status IN ('pending', 'granted', 'denied', 'used', 'expired', 'revoked'));
ALTER TABLE approvals ADD COLUMN sealed_call BYTEA;
ALTER TABLE approvals ADD COLUMN decided_by TEXT;
UPDATE approvals SET status = 'used' WHERE status = 'granted' AND uses_left <= 0;
UPDATE approvals SET expires_at = created_at + 86400000 WHERE status = 'pending';
ALTER TABLE admin_tokens ADD COLUMN role TEXT NOT NULL DEFAULT 'admin'
    CHECK (role IN ('admin', 'approver'));
