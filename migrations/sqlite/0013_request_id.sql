-- The request id (issue 28): one per data-plane request, the caller's
-- traceparent trace id when it sent one, else minted; the same value as in
-- the access line and the answer's X-Request-Id. NULL: written before this
-- migration. Indexed for `tessera audit --request-id`: a request's rows
-- among all of them (the index costs each row a B-tree insert, as
-- 0008's note on audit_at weighs; this one serves a query).
ALTER TABLE audit ADD COLUMN request_id TEXT;
CREATE INDEX audit_request_id ON audit (request_id);
