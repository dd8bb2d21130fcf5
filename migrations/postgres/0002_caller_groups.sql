-- Groups a caller belongs to, for authorization policies: names separated
-- by commas, each checked by the CLI to hold no comma.
ALTER TABLE callers ADD COLUMN groups TEXT NOT NULL DEFAULT '';
