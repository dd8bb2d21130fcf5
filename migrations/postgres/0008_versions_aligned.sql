-- Nothing: SQLite's 0008 dropped an index (audit.at) this dialect keeps.
-- Present so that both folders carry the same versions with the same
-- meaning from 0009 on.
SELECT 1;
