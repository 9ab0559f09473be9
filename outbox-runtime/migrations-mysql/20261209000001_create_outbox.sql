-- The outbox on MySQL 8 and MariaDB 10.6+: PostgreSQL's `outbox.events` as one table of the
-- application's database (a schema is a database there), every column of the reference design
-- under its name.
--
-- Types: a uuid is its 16 bytes (BINARY(16), sqlx's encoding of `Uuid`); JSON is JSON (binary on
-- MySQL, checked text on MariaDB); an instant is DATETIME(6) in UTC, written with
-- UTC_TIMESTAMP(6) whatever the session's time zone. `seq` is the clustered primary key: rows
-- sit in the order they were written. Text compares byte for byte (`utf8mb4_bin`, on both
-- servers), as PostgreSQL's `text` does, but for trailing spaces, which these collations ignore
-- ('k' and 'k ' are one idempotency key). sqlx 0.8 reads such columns as bytes: read them as
-- `CAST(aggregate_id AS CHAR)`, as the crate's own statements do (sqlx 0.9 reads them as text).
-- Lengths: InnoDB keys are at most 3,072 bytes, 768
-- characters of utf8mb4, which the pending index below spends on three names of 128.
CREATE TABLE IF NOT EXISTS outbox_events (
    seq             BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id        BINARY(16)   NOT NULL,
    aggregate_type  VARCHAR(128) NOT NULL,
    aggregate_id    VARCHAR(255) NOT NULL,
    event_type      VARCHAR(128) NOT NULL,
    payload         JSON         NOT NULL,
    headers         JSON         NOT NULL DEFAULT ('{}'),
    created_at      DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    available_at    DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    attempts        INT          NOT NULL DEFAULT 0,
    last_error      TEXT,
    published_at    DATETIME(6),

    ordered         BOOLEAN      NOT NULL DEFAULT FALSE,
    idempotency_key VARCHAR(255),
    lease_token     BINARY(16),
    dead_at         DATETIME(6),
    expired_leases  INT          NOT NULL DEFAULT 0,
    event_version   INT          NOT NULL DEFAULT 1 CHECK (event_version >= 1),
    subscriber      VARCHAR(128) NOT NULL DEFAULT '',
    source_event_id BINARY(16),

    UNIQUE KEY outbox_events_event_id (event_id),
    -- No partial indexes: pending rows are those with both NULLs, an equality on the key's
    -- prefix, so the range on available_at and the order by seq stay on the index.
    KEY outbox_events_pending_by_type
        (published_at, dead_at, aggregate_type, event_type, subscriber, available_at, seq),
    KEY outbox_events_dead (dead_at),
    KEY outbox_events_published (published_at),
    KEY outbox_events_by_aggregate (aggregate_type, aggregate_id, seq),
    -- A unique key admits any number of NULLs: keyless events and events that are not copies.
    UNIQUE KEY outbox_events_idempotency_key (aggregate_type, idempotency_key),
    UNIQUE KEY outbox_events_subscriber_copies (source_event_id, subscriber)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Ordered events of one aggregate are written one transaction at a time, as PostgreSQL's
-- advisory lock does: an emit takes its aggregate's row here (inserted the first time) until it
-- commits, so events draw their `seq` in the order their transactions commit.
CREATE TABLE IF NOT EXISTS outbox_aggregate_locks (
    aggregate_type VARCHAR(128) NOT NULL,
    aggregate_id   VARCHAR(255) NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
