-- What the relays did minute by minute, for the console's charts of the last hour and day:
-- the events they delivered, counted by the relays themselves (so forwarded events and events
-- deleted on publish count, and charting a busy day reads 1,440 rows, never the published
-- rows), and the outbox's pending and dead events and lag as one relay read them in the minute.
-- Every relay adds its deliveries at each heartbeat (every 5 s, an upsert of the minute's row);
-- the first heartbeat of a minute that finds the minute without a reading takes one (a count of
-- the pending and dead rows, as `outbox status` makes: one a minute per database) and deletes
-- the rows older than a day. Minutes when no relay ran have no row.
CREATE TABLE outbox.activity (
    minute                  timestamptz PRIMARY KEY,
    delivered               bigint      NOT NULL DEFAULT 0,
    pending                 bigint,
    dead                    bigint,
    -- The age of the oldest pending event, in seconds; NULL when nothing was pending (or before
    -- the minute's reading).
    oldest_pending_age_secs double precision,
    read                    boolean     NOT NULL DEFAULT false
);
