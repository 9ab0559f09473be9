-- Every delivered event leaves dead row versions, and their entries at the head of the pending
-- index, where a relay that has caught up starts every lease: until vacuum removes them, each
-- lease steps over all of them (5 ms and 2,773 buffers per lease, for minutes, after a drain of
-- 150,000 events behind 2,000,000 published rows; 0.4 ms and one buffer once vacuumed).
-- PostgreSQL's default waits for dead rows to reach a fifth of the table, which a table of long
-- history may not see for a long time after a burst; an outbox is a queue, and is vacuumed after
-- 1% of it plus 10,000 rows instead (there, 20 s after the drain). Only where autovacuum runs
-- (`SHOW autovacuum`); an application may set its own with ALTER TABLE.
ALTER TABLE outbox.events SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 10000
);
