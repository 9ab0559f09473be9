-- Fan-out: several named subscribers per event type, each with its own attempts, backoff, dead
-- letters and per-aggregate order. Emitting is unchanged (no row per subscriber is written at
-- emit time). A relay that leases an event delivers it to the subscribers it runs, and in the
-- statement that acknowledges it writes one row per subscriber that still needs it (one that
-- failed, snoozed, waits behind an earlier event of its aggregate, or runs elsewhere): a copy of
-- the event with `subscriber` set, which relays lease, retry and kill as any other row. An event
-- that every subscriber took at once costs what it cost before.

-- '' for an event as emitted; a subscriber's name for its copy.
ALTER TABLE outbox.events ADD COLUMN subscriber text NOT NULL DEFAULT '';
-- A copy's event, whose id its handler sees; NULL for an event as emitted.
ALTER TABLE outbox.events ADD COLUMN source_event_id uuid;

-- One copy per event and subscriber: writing it twice (a replay) does nothing the second time.
CREATE UNIQUE INDEX events_subscriber_copies ON outbox.events (source_event_id, subscriber)
    WHERE source_event_id IS NOT NULL;

-- A relay leases a subscriber's copies by this index, past every other subscriber's: a backlog of
-- one subscriber costs the others nothing. It holds only pending rows, so rebuilding it reads
-- the table once and writes what is pending.
DROP INDEX outbox.events_pending_by_type;
CREATE INDEX events_pending_by_type
    ON outbox.events (aggregate_type, event_type, subscriber, available_at, seq)
    WHERE published_at IS NULL AND dead_at IS NULL;

-- The subscribers relays run, by event type: a relay registers its own before it leases, and
-- the acknowledgement of an event writes a copy for each registered subscriber that did not take
-- it. A subscriber stays registered when its code is removed (its copies wait for it); `outbox
-- subscribers remove` removes it with its copies.
CREATE TABLE outbox.subscribers (
    aggregate_type text        NOT NULL,
    event_type     text        NOT NULL,
    subscriber     text        NOT NULL CHECK (subscriber <> ''),
    registered_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (aggregate_type, event_type, subscriber)
);
