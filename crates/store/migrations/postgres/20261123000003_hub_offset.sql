-- Postgres twin of migrations/sqlite/20261123000003_hub_offset.sql. DOUBLE PRECISION, as SQLite's REAL is
-- 8 bytes: both decode as f64 through sqlx's Any driver.
ALTER TABLE images ADD COLUMN hub_offset DOUBLE PRECISION NOT NULL DEFAULT 0;
