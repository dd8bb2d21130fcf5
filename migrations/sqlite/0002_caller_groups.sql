-- Groups a caller belongs to, for authorization policies (Cedar
-- `principal in Group::"name"`): names separated by commas, each checked by
-- the CLI to hold no comma.
ALTER TABLE callers ADD COLUMN groups TEXT NOT NULL DEFAULT '';
