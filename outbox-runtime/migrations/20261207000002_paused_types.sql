-- Event types an operator paused: no relay leases their rows until they are resumed (rows leased
-- before the pause are delivered). Every lease reads this table by its primary key, once per
-- event type it leases.
CREATE TABLE outbox.paused_types (
    aggregate_type text        NOT NULL,
    event_type     text        NOT NULL,
    paused_at      timestamptz NOT NULL DEFAULT now(),
    -- Why, in the operator's words, for whoever looks next.
    reason         text,
    PRIMARY KEY (aggregate_type, event_type)
);

-- Every relay's lease reads it: readable by every role, so a relay role granted before this
-- migration keeps leasing after it (it holds only type names, times and reasons).
GRANT SELECT ON outbox.paused_types TO PUBLIC;
