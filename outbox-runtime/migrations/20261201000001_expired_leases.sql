-- Expired leases are counted apart from failed deliveries. A lease expires when its relay died,
-- or could not reach the database or run for a whole lease timeout: that says little about the
-- event, so a healthy event must not die of it the way it dies of failing handlers. Expiries
-- have their own, higher limit (`RelayBuilder::max_expired_leases`), which still stops an event
-- that kills every relay delivering it. From now on `attempts` counts failed deliveries only.
ALTER TABLE outbox.events ADD COLUMN expired_leases integer NOT NULL DEFAULT 0;
