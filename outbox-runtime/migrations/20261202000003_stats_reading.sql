-- The table-wide gauges (pending, dead, oldest pending age, per type and version) need a count of
-- every pending row, which visits each one's heap row: a 200,000-row backlog took 234 ms to
-- count. Every relay refreshed them every 15 s, so ten relays counted ten times. Now one relay
-- counts (whichever finds the reading stale and takes the advisory lock on
-- `hashtextextended('outbox.stats_reading', 0)`), stores the reading here, and every other relay
-- reads it: one count per interval per database, whatever the number of relays.
CREATE TABLE outbox.stats_reading (
    -- A single row.
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    read_at   timestamptz NOT NULL,
    -- `[{aggregate_type, event_type, event_version, pending, dead, oldest_pending}]`, the
    -- oldest pending event's `created_at` (null when the type has dead events only).
    by_type   jsonb NOT NULL
);
