-- The inbox: events that arrived from a broker, one row per consumer and event id. A handled
-- row is what makes a redelivery a duplicate: it is written in the handler's own transaction,
-- so the effect and the record commit together. A failing row keeps the message (payload and
-- headers) and its attempts; a dead one keeps it until an operator requeues or discards it.
CREATE TABLE outbox.inbox (
    consumer       text        NOT NULL,
    event_id       uuid        NOT NULL,
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    event_version  integer     NOT NULL CHECK (event_version > 0),
    -- When the message first arrived, and when its handler's transaction committed.
    received_at    timestamptz NOT NULL DEFAULT now(),
    handled_at     timestamptz,
    -- Failed handler calls, the last one's error with its causes, and when it ran out of them.
    attempts       integer     NOT NULL DEFAULT 0,
    last_error     text,
    dead_at        timestamptz,
    -- The message, kept while it is not handled (a dead letter is requeued from it): the payload
    -- as it arrived (text, so that one that is not JSON is kept too), the other headers.
    payload        text,
    headers        jsonb,
    PRIMARY KEY (consumer, event_id),
    CHECK (handled_at IS NULL OR dead_at IS NULL)
);

-- Retention deletes handled rows older than the broker's redelivery window, oldest first.
CREATE INDEX inbox_handled ON outbox.inbox (consumer, handled_at) WHERE handled_at IS NOT NULL;
-- The dead letters of a consumer, for the operations that list and requeue them.
CREATE INDEX inbox_dead ON outbox.inbox (consumer, dead_at, event_id) WHERE dead_at IS NOT NULL;
