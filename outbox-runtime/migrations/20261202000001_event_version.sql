-- The version of the payload's shape (`#[outbox(version = N)]`), so a relay reads each row as
-- the version it was written at and upcasts it to its handler's. Rows written before this
-- column, or by SQL that does not name it, are version 1. The check is NOT VALID so adding it
-- does not scan a large outbox: every existing row holds the default.
ALTER TABLE outbox.events ADD COLUMN event_version integer NOT NULL DEFAULT 1;
ALTER TABLE outbox.events ADD CONSTRAINT events_event_version_positive
    CHECK (event_version >= 1) NOT VALID;
