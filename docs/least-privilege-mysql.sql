-- Least-privilege accounts for the outbox on MySQL 8 and MariaDB 10.6+: the grants each part
-- needs, and no more: `migrate`, `emit` and the relay.
--
-- Placeholders: replace `outbox_db` (the application's database, which holds the outbox's
-- tables), `outbox_owner`, `outbox_app` and `outbox_relay` (accounts, with their hosts)
-- throughout.
-- tests/emit_backends.rs runs this file with unique names substituted, against MariaDB 10.11,
-- and proves every claim below.
--
--   outbox_owner  runs `outbox_runtime::migrate` (or `outbox migrate`) at deploy time: creates
--                 the tables and records them in `outbox_migrations`.
--   outbox_app    your application's account: `emit`, `emit_with`, `emit_all` and
--                 `emit_idempotent` inside its own transactions.
--   outbox_relay  runs the relay: leases, acknowledgements, retries, dead letters, retention.
--
-- What the statements need, and why (found by testing, not guessed):
--   * Emit is one INSERT into `outbox_events`: INSERT. A keyed emit whose key is stored
--     already fails that INSERT on the unique key (MySQL undoes the statement, not the
--     transaction) and reads the stored event's id with a shared lock (`LOCK IN SHARE MODE`):
--     SELECT on the three columns it names, and nothing else, so the application cannot read
--     payloads, headers or aggregate ids.
--   * An ordered emit first takes its aggregate's row in `outbox_aggregate_locks` with
--     `INSERT ... ON DUPLICATE KEY UPDATE aggregate_id = aggregate_id`: INSERT, UPDATE and
--     SELECT on that table, which holds nothing but the names of aggregates.
--   * `migrate` creates tables (CREATE, INDEX for their keys), reads and writes its history
--     (SELECT, INSERT), and takes a named lock (`GET_LOCK`, which needs no privilege).
--   * The relay reads the rows it leases (SELECT), writes leases and outcomes (UPDATE), deletes
--     delivered rows with `delete_on_publish` and old ones with retention (DELETE), and reads the
--     migrations' history at start (SELECT on `outbox_migrations`). Its account neither inserts
--     events nor touches the application's tables.

-- Two steps: `accounts` before the first migrate, `tables` after it (MySQL grants on a table only
-- once it exists).

-- step: accounts
CREATE USER outbox_owner IDENTIFIED BY 'change me';
GRANT CREATE, INDEX, SELECT, INSERT ON outbox_db.* TO outbox_owner;

CREATE USER outbox_app IDENTIFIED BY 'change me';

CREATE USER outbox_relay IDENTIFIED BY 'change me';

-- step: tables
GRANT INSERT ON outbox_db.outbox_events TO outbox_app;
GRANT SELECT (event_id, aggregate_type, idempotency_key) ON outbox_db.outbox_events TO outbox_app;
GRANT SELECT, INSERT, UPDATE ON outbox_db.outbox_aggregate_locks TO outbox_app;

GRANT SELECT, UPDATE, DELETE ON outbox_db.outbox_events TO outbox_relay;
GRANT SELECT ON outbox_db.outbox_migrations TO outbox_relay;
