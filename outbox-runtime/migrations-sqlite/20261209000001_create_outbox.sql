-- The outbox on SQLite: PostgreSQL's `outbox.events` as one table of the application's database,
-- every column of the reference design under its name. SQLite has no schemas, so the table's
-- name carries the prefix; a STRICT table, so a column holds only its declared type.
--
-- Types: a uuid is its 16 bytes (BLOB, sqlx's encoding of `Uuid`); JSON is TEXT that
-- `json_valid` accepts; an instant is UTC TEXT as SQLite's date functions write it,
-- 'YYYY-MM-DD HH:MM:SS.SSS', which sorts as it compares. `seq` is the rowid, AUTOINCREMENT so
-- a number is never handed out twice: it orders events as they were written, and SQLite writes
-- one transaction at a time.
CREATE TABLE outbox_events (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id        BLOB    NOT NULL UNIQUE CHECK (length(event_id) = 16),
    aggregate_type  TEXT    NOT NULL,
    aggregate_id    TEXT    NOT NULL,
    event_type      TEXT    NOT NULL,
    payload         TEXT    NOT NULL CHECK (json_valid(payload)),
    headers         TEXT    NOT NULL DEFAULT '{}' CHECK (json_valid(headers)),
    created_at      TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    available_at    TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    published_at    TEXT,

    ordered         INTEGER NOT NULL DEFAULT 0 CHECK (ordered IN (0, 1)),
    idempotency_key TEXT,
    lease_token     BLOB,
    dead_at         TEXT,
    expired_leases  INTEGER NOT NULL DEFAULT 0,
    event_version   INTEGER NOT NULL DEFAULT 1 CHECK (event_version >= 1),
    subscriber      TEXT    NOT NULL DEFAULT '',
    source_event_id BLOB
) STRICT;

-- PostgreSQL's partial indexes, one for one.
CREATE INDEX outbox_events_pending_by_type
    ON outbox_events (aggregate_type, event_type, subscriber, available_at, seq)
    WHERE published_at IS NULL AND dead_at IS NULL;

CREATE INDEX outbox_events_dead ON outbox_events (dead_at) WHERE dead_at IS NOT NULL;

CREATE INDEX outbox_events_published ON outbox_events (published_at)
    WHERE published_at IS NOT NULL;

CREATE INDEX outbox_events_ordered_undelivered ON outbox_events (aggregate_type, aggregate_id, seq)
    WHERE ordered = 1 AND published_at IS NULL;

CREATE UNIQUE INDEX outbox_events_idempotency_key ON outbox_events (aggregate_type, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

CREATE UNIQUE INDEX outbox_events_subscriber_copies ON outbox_events (source_event_id, subscriber)
    WHERE source_event_id IS NOT NULL;
