-- The index on audit.at served no query: the trail is read by id (newest
-- first, or following an id), and `at >= ?` is a filter on those rows.
-- EXPLAIN QUERY PLAN shows the primary key only. It cost a B-tree insert
-- per audit row, in the serving process.
DROP INDEX IF EXISTS audit_at;
