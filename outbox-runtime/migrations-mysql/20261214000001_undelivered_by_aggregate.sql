-- The relay's test that an ordered event comes first among its aggregate's undelivered ones:
-- its aggregate's rows with `published_at` NULL before it, a range of this index, however long
-- the aggregate's history of published rows (PostgreSQL and SQLite have a partial index).
-- One statement: should a migrator die before recording it, the next one finds the index there
-- (MySQL 8 has no `IF NOT EXISTS` for indexes) and records it.
CREATE INDEX outbox_events_undelivered_by_aggregate
    ON outbox_events (aggregate_type, aggregate_id, published_at, seq);
