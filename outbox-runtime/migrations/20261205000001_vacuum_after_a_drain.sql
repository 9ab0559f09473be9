-- Every delivered row leaves dead entries in the pending index where it used to wait: at the
-- head, where a relay that has caught up starts each lease. Only vacuum removes them, and with
-- the server's default (a vacuum once 20% of the table is dead) a table that keeps its history
-- may never be vacuumed after a burst: on 2,000,000 published rows, the 300,000 dead versions
-- that draining 150,000 events leaves do not reach the threshold, and every lease of the
-- caught-up relay then reads thousands of dead index pages (BENCHMARKS.md, `after_drain`).
-- Vacuum once 1% of the table (plus 10,000 rows) is dead instead: on that table, within the
-- autovacuum launcher's next round after the burst. These are the table's own settings (they
-- change nothing else on the server); an operator may set others with ALTER TABLE, and no later
-- migration of the outbox overwrites them. SHARE UPDATE EXCLUSIVE: producers and relays go on.
ALTER TABLE outbox.events SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 10000
);
