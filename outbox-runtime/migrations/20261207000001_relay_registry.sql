-- Every running relay announces itself here and keeps a heartbeat, so operators (`outbox
-- status`, and the console) see which relays are alive, what they hold and deliver, and which
-- went silent: a relay that stops gracefully withdraws its row; one that was killed leaves it,
-- its heartbeat growing old, until a relay starting later removes rows silent for a day.
CREATE TABLE outbox.relays (
    relay_id     uuid        PRIMARY KEY,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    -- outbox-runtime's version, as its Cargo.toml says.
    version      text        NOT NULL,
    lease_mode   text        NOT NULL,
    -- 'aggregate_type/event_type' of each type it has a handler for.
    handles      text[]      NOT NULL,
    -- The types it forwards to a broker, as `handles` names them, or '{*}' for every type no
    -- handler takes; NULL when it forwards nothing.
    forwards_to  text[],
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    -- Rows it holds a lease on, and events it delivered, as of its last heartbeat.
    held         integer     NOT NULL DEFAULT 0,
    delivered    bigint      NOT NULL DEFAULT 0
);
