//! Several `tessera serve` processes over one store (the Postgres leg; on
//! SQLite the tests here check what one file can promise).
