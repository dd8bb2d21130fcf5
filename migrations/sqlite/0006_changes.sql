-- `tessera policy reload` bumps `policies`: every serving process then
-- reads its policy folder again. (Serving processes poll the revision row;
-- Postgres also notifies them, see migrations/postgres/0006_changes.sql.)
ALTER TABLE revision ADD COLUMN policies INTEGER NOT NULL DEFAULT 0;
