-- The pending rows keep one index, per type: every index on the outbox is written by every
-- emit and again by every lease, and the global one only served relays that lease all types,
-- which now walk the per-type index type by type instead.
DROP INDEX outbox.events_pending;
