-- The public URL the last `serve` to start answers on, so that admin
-- commands run without its settings (`connection add` with no --listen or
-- --public-url) print the URL actually served. One row; not a secret.
CREATE TABLE served (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    public_url TEXT NOT NULL,
    at         BIGINT NOT NULL -- unix milliseconds
);
