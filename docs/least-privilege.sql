-- Least-privilege roles for the outbox: the grants each part of it needs, and no more.
--
-- Three roles. Their names here are placeholders: replace `outbox_owner`, `outbox_app` and
-- `outbox_relay` throughout with yours (tests/privileges.rs runs this file with unique names
-- substituted, against PostgreSQL 15, and proves every claim below, `outbox.emit`'s included).
--
--   outbox_owner  owns the `outbox` schema and runs `outbox_runtime::migrate` (or `outbox migrate`)
--                 at deploy time. Not a superuser.
--   outbox_app    your application's role: `emit`, `emit_with`, `emit_all` inside its own
--                 transactions, and `outbox.emit(...)` from SQL (triggers, other languages).
--                 It keeps whatever it already has on its own tables.
--   outbox_relay  runs `Relay` (deliver, retry, dead letters, `RelayBuilder::retention`) and the
--                 operations: `dead_letters::{list, get, count, requeue, discard}`,
--                 `purge_published`, `stats`, `stats_by_type`, `relays::relays`,
--                 `pauses::{pause, resume, paused}`, `replay::{count, replay}`, `events::get`,
--                 and the `outbox` CLI's commands other than `migrate`.
--
-- No role needs SUPERUSER, CREATEROLE, CREATEDB, BYPASSRLS or REPLICATION at run time.
-- The library builds no SQL from input: every value is bound, and the schema and table names
-- are fixed (`outbox.events`), so there is no identifier to configure or to inject through.
--
-- What the statements need, and why (found by testing, not guessed):
--   * Emit is one INSERT. One unordered event without an idempotency key is a plain
--     single-row INSERT; with a key it adds `ON CONFLICT (aggregate_type, idempotency_key)
--     WHERE ... DO NOTHING`; a batch (`emit_all`) or an ordered event is an
--     `INSERT ... SELECT FROM UNNEST(...) ON CONFLICT ... DO NOTHING RETURNING event_id`.
--     PostgreSQL requires SELECT on the columns of the conflict target (aggregate_type,
--     idempotency_key) to infer the arbiter index, and SELECT on event_id for RETURNING; the
--     lookup after a duplicate key reads the same three columns. So the application needs
--     SELECT on those three columns (batches need them even without idempotency keys), and on
--     nothing else: it cannot read payloads, headers or aggregate ids.
--   * `outbox.emit(...)` is SECURITY INVOKER: it runs the same INSERT (and lookup) with the
--     caller's rights, so it needs the grants above plus EXECUTE on itself and on
--     `outbox.uuid_v7()`, which makes its ids and those of rows inserted without `event_id`.
--     PUBLIC may execute both by default. Called from a trigger function of yours (SECURITY
--     INVOKER, the default), it runs as the role whose statement fired the trigger.
--   * `seq` is an identity column: inserting draws from its sequence without any privilege on
--     it, so there is no GRANT on `outbox.events_seq_seq`.
--   * The insert trigger's function `outbox.notify_relays()` is not checked for EXECUTE when the
--     trigger fires, so EXECUTE is revoked from PUBLIC (by the migrations). It is SECURITY
--     DEFINER (with a pinned search_path): it reads `outbox.sleeping_relays` as the owner, so the
--     application needs no access to that table. So is `outbox.flag_relays_asleep()`, the
--     registrations' trigger, which sets the flag `outbox.relays_asleep` as the owner.
--   * The insert trigger's WHEN reads that flag with `pg_sequence_last_value` as the inserting
--     role: the migration grants SELECT on the sequence to PUBLIC (it says only whether a relay
--     sleeps). The trigger's function calls `pg_notify` and `set_config`, and ordered emits call
--     `pg_advisory_xact_lock` and `hashtextextended`: all executable by PUBLIC in a default
--     cluster. If yours revoked them from PUBLIC, grant them to outbox_app (and `pg_notify`,
--     `pg_advisory_xact_lock`, `hashtextextended` and `setval` to outbox_relay:
--     `dead_letters::requeue` notifies, a registration sets the flag under an advisory lock, and
--     an idle relay reads `pg_locks`, which PUBLIC may read by default, as it may `pg_database`).
--   * The relay's lease takes row locks (`FOR UPDATE SKIP LOCKED`), which needs UPDATE on at
--     least one column; it updates only the bookkeeping columns, so it gets UPDATE on those alone
--     and cannot rewrite an event's payload, headers, type or ids. LISTEN needs no privilege.
--
-- Run the steps in order: `roles` and `database` as a superuser (or a role with CREATEROLE
-- that owns the database), then `outbox_runtime::migrate` connected as outbox_owner, then
-- `objects` as outbox_owner (or a superuser). Run `objects` again after upgrading the outbox if a
-- release notes a schema change: column grants do not extend to new columns.

-- step: roles
-- Add PASSWORD '...' (or whatever your authentication uses) to each.
CREATE ROLE outbox_owner LOGIN;
CREATE ROLE outbox_app LOGIN;
CREATE ROLE outbox_relay LOGIN;

-- step: database
-- CONNECT is granted to PUBLIC by default; granting it explicitly keeps these roles working in a
-- database that revoked it. `migrate` runs `CREATE SCHEMA IF NOT EXISTS outbox` every time, and
-- PostgreSQL checks CREATE on the database even when the schema exists, so the owner keeps it.
DO $$
BEGIN
    EXECUTE format('GRANT CONNECT, CREATE ON DATABASE %I TO outbox_owner', current_database());
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO outbox_app, outbox_relay', current_database());
END
$$;

-- step: objects
-- After `outbox_runtime::migrate` ran as outbox_owner (which then owns the schema, the table and
-- the migration history `outbox._sqlx_migrations`, of which the relay reads two columns).
GRANT USAGE ON SCHEMA outbox TO outbox_app, outbox_relay;

-- The application: insert events, and read the three columns emit's statements need.
GRANT INSERT (event_id, aggregate_type, aggregate_id, event_type, payload, headers,
              available_at, ordered, idempotency_key, event_version)
    ON outbox.events TO outbox_app;
GRANT SELECT (event_id, aggregate_type, idempotency_key) ON outbox.events TO outbox_app;
-- Emit from SQL. PUBLIC may execute functions by default: granting it explicitly keeps the
-- application working in a database that revoked that.
GRANT EXECUTE ON FUNCTION outbox.emit, outbox.uuid_v7() TO outbox_app;

-- The inbox (`inbox::Inbox`): the application's consumers record each message they handle (an
-- upsert that reads its conflicting row), count failures, keep dead letters with their payloads,
-- and purge old records (`Inbox::purge_handled`). The records are the application's own.
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.inbox TO outbox_app;

-- The relay: read events, update their delivery bookkeeping, delete published (retention) and
-- dead (discard) ones. It inserts only subscribers' copies of events (the acknowledgement of an
-- event with subscribers, `replay::replay_to`), never new events: a relay whose transactional
-- handlers emit follow-up events also needs outbox_app's grants (`GRANT outbox_app TO
-- outbox_relay`).
GRANT SELECT, DELETE ON outbox.events TO outbox_relay;
GRANT UPDATE (available_at, lease_token, attempts, expired_leases, last_error, dead_at,
                published_at)
    ON outbox.events TO outbox_relay;
GRANT INSERT (source_event_id, subscriber, aggregate_type, aggregate_id, event_type,
              event_version, payload, headers, created_at, ordered, available_at, attempts,
              last_error, dead_at)
    ON outbox.events TO outbox_relay;
-- (So the relay role can write rows that relays deliver, as copies: keep its credentials with the
-- relays and the operators.)
-- A relay registers the subscribers it runs when it starts; `subscribers::remove` (`outbox
-- subscribers remove`) forgets one.
GRANT SELECT, INSERT, DELETE ON outbox.subscribers TO outbox_relay;
-- An idle relay registers itself as asleep (an upsert), and withdraws when it wakes.
GRANT SELECT, INSERT, DELETE ON outbox.sleeping_relays TO outbox_relay;
GRANT UPDATE (event_types, until) ON outbox.sleeping_relays TO outbox_relay;
-- The relays of a database share one reading of the pending and dead counts for their gauges:
-- whichever finds it stale counts and stores it (an upsert).
GRANT SELECT, INSERT, UPDATE ON outbox.stats_reading TO outbox_relay;
-- Each running relay keeps an entry with its heartbeat (an upsert), removes it when it stops, and
-- removes those of relays silent for a day; `outbox status` lists them.
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.relays TO outbox_relay;
-- Each heartbeat adds the relay's deliveries to the minute's row of the console's charts; the
-- first of a minute stores a reading and deletes the rows older than a day.
GRANT SELECT, INSERT, UPDATE, DELETE ON outbox.activity TO outbox_relay;
-- Pausing and resuming an event type (`outbox pause`, `pauses::{pause, resume}`); every lease
-- reads the paused types, which the migration lets every role read.
GRANT INSERT, DELETE ON outbox.paused_types TO outbox_relay;
-- At start the relay (and the CLI) compares the migrations applied with the ones it needs, to
-- refuse an outdated schema with what to do instead of failing on every statement: it reads
-- which versions succeeded, and nothing else of the history.
GRANT SELECT (version, success) ON outbox._sqlx_migrations TO outbox_relay;

-- Nobody calls the trigger function directly; firing the trigger needs no EXECUTE.
REVOKE EXECUTE ON FUNCTION outbox.notify_relays() FROM PUBLIC;
