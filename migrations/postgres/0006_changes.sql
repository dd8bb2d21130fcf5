-- `tessera policy reload` bumps `policies`: every serving process then
-- reads its policy folder again.
ALTER TABLE revision ADD COLUMN policies BIGINT NOT NULL DEFAULT 0;

-- Every change bumps the revision row in its own transaction; this trigger
-- tells every listening replica at that transaction's commit (Postgres
-- delivers NOTIFY on commit, and drops it on rollback).
CREATE FUNCTION tessera_notify_change() RETURNS trigger AS $$
BEGIN
    PERFORM pg_notify('tessera_changes', NEW.value::text);
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER revision_changed AFTER UPDATE ON revision
    FOR EACH ROW EXECUTE FUNCTION tessera_notify_change();
