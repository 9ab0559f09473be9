-- The outbox table. Every column of the reference design is here with its name and type, so
-- operational SQL written for it keeps working; the columns after `published_at` are ours.
CREATE SCHEMA IF NOT EXISTS outbox;

CREATE TABLE outbox.events (
    event_id       uuid        PRIMARY KEY,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    headers        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- Earliest time a relay may lease the row. A lease pushes it forward by the lease timeout,
    -- which hides the row from every other relay until the lease expires.
    available_at   timestamptz NOT NULL DEFAULT now(),
    -- Failed deliveries plus expired leases; successful deliveries do not count.
    attempts       integer     NOT NULL DEFAULT 0,
    last_error     text,
    published_at   timestamptz,

    -- Insertion order: ties on available_at, and the delivery order of ordered events. An
    -- ordered emit locks its aggregate before taking a number, so per aggregate it is also
    -- commit order.
    seq            bigint      GENERATED ALWAYS AS IDENTITY,
    -- Delivered one at a time per aggregate, in `seq` order.
    ordered        boolean     NOT NULL DEFAULT false,
    -- A producer's key for the command behind the event: one event per key and aggregate type.
    idempotency_key text,
    -- Fencing token of the current lease: acknowledgements must present it.
    lease_token    uuid,
    -- Set when the row exhausted its attempts (a dead letter); never leased again.
    dead_at        timestamptz
);

-- The relay's lease queries read only these partial indexes, so published history does not
-- slow them down: per handled type (the default), or across all types.
CREATE INDEX events_pending_by_type ON outbox.events (aggregate_type, event_type, available_at, seq)
    WHERE published_at IS NULL AND dead_at IS NULL;

CREATE INDEX events_pending ON outbox.events (available_at, seq)
    WHERE published_at IS NULL AND dead_at IS NULL;

CREATE INDEX events_dead ON outbox.events (dead_at)
    WHERE dead_at IS NOT NULL;

-- Retention deletes published rows oldest first, in small batches.
CREATE INDEX events_published ON outbox.events (published_at)
    WHERE published_at IS NOT NULL;

-- Finds whether an ordered event has an undelivered predecessor in its aggregate.
CREATE INDEX events_ordered_undelivered ON outbox.events (aggregate_type, aggregate_id, seq)
    WHERE ordered AND published_at IS NULL;

CREATE UNIQUE INDEX events_idempotency_key ON outbox.events (aggregate_type, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- Wake relays as soon as events commit: NOTIFY is delivered at commit, once per transaction.
CREATE FUNCTION outbox.notify_relays() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_events', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER events_notify_relays
    AFTER INSERT ON outbox.events
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.notify_relays();
