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

    -- Insertion order: ties on available_at, and per-aggregate ordering.
    seq            bigint      GENERATED ALWAYS AS IDENTITY,
    -- The inserting transaction, so ordered delivery can wait for earlier transactions to end.
    tx_id          xid8        NOT NULL DEFAULT pg_current_xact_id(),
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
