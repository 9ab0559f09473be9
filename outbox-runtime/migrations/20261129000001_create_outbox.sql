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

-- Relays asleep on LISTEN, and the event types they wait for (NULL: all). NOTIFY makes every
-- committing transaction that sends one queue on a database-wide lock, so producers notify only
-- when a relay that wants their events is asleep; awake relays keep looking by themselves.
CREATE TABLE outbox.sleeping_relays (
    relay_id    uuid        PRIMARY KEY,
    event_types text[],
    -- The registration lapses then, so a relay that died asleep stops costing NOTIFYs.
    until       timestamptz NOT NULL
);

-- Wakes sleeping relays when events commit (NOTIFY is delivered at commit). A relay registers
-- under this lock taken exclusively, and looks once more before it sleeps: so an insert either
-- sees the registration or commits before that last look. SECURITY DEFINER, so an application
-- role that may only insert events needs no access to the registrations.
CREATE FUNCTION outbox.notify_relays() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('outbox.sleeping_relays', 0));
    IF EXISTS (
        SELECT 1 FROM outbox.sleeping_relays s
        WHERE s.until > now()
          AND (s.event_types IS NULL
               OR EXISTS (SELECT 1 FROM inserted i WHERE i.event_type = ANY (s.event_types)))
    ) THEN
        PERFORM pg_notify('outbox_events', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER events_notify_relays
    AFTER INSERT ON outbox.events
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.notify_relays();
