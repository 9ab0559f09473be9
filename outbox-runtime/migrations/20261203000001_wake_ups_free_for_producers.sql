-- Wake-ups that cost producers nothing while no relay sleeps. The insert trigger was a statement
-- trigger: every insert built a transition table, ran PL/pgSQL, took a shared advisory lock and
-- read the registrations, about a fifth of an event's cost, even with every relay busy. Now a
-- row trigger's WHEN reads a flag that says whether any relay may be asleep; the function runs
-- only while one may be, and at most until it has notified once in the transaction.

-- The flag: 1 while a registration may be live, 0 when none is. A sequence, because `setval` is
-- seen by every session at once, outside transactions, and a trigger's WHEN can read it with a
-- plain function call (`pg_sequence_last_value`), which no table allows. Never called, it reads
-- NULL, which the WHEN takes as "no relay asleep"; the first registration sets it.
CREATE SEQUENCE outbox.relays_asleep AS smallint MINVALUE 0 MAXVALUE 1 START 0;
-- Reading it is checked against the inserting role: any role may learn whether a relay sleeps.
GRANT SELECT ON SEQUENCE outbox.relays_asleep TO PUBLIC;

-- Keeps the flag after every change to the registrations. The exclusive lock, held until the
-- change commits, orders the writers of the flag: each one computes it from a snapshot taken
-- after every earlier writer committed, so the last write always counts the live registrations.
-- Read committed takes that fresh snapshot per statement; a stricter default isolation reads the
-- transaction's first one, so there the flag stays up (it only costs producers the function).
-- A registration that lapses (its relay died asleep) leaves the flag up until the next change.
CREATE FUNCTION outbox.flag_relays_asleep() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('outbox.relays_asleep', 0));
    PERFORM setval('outbox.relays_asleep',
                   CASE WHEN current_setting('transaction_isolation') <> 'read committed'
                             OR EXISTS (SELECT 1 FROM outbox.sleeping_relays WHERE until > now())
                        THEN 1 ELSE 0 END);
    RETURN NULL;
END
$$;
REVOKE EXECUTE ON FUNCTION outbox.flag_relays_asleep() FROM PUBLIC;

CREATE TRIGGER sleeping_relays_flag
    AFTER INSERT OR UPDATE OR DELETE ON outbox.sleeping_relays
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.flag_relays_asleep();

-- Notifies once per transaction, if a relay that wants this row's event type sleeps. A producer
-- that read the flag down before a relay registered is caught by the relay instead: every insert
-- holds a RowExclusiveLock on outbox.events, taken before the row's WHEN reads the flag, so the
-- relay reads those lock holders after raising the flag and looks again as each one ends
-- (`store/sleepers.rs`). The NOTIFY reaches every listener at commit, those registered later in
-- the transaction included, so one per transaction is enough.
CREATE OR REPLACE FUNCTION outbox.notify_relays() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM outbox.sleeping_relays s
        WHERE s.until > now() AND (s.event_types IS NULL OR NEW.event_type = ANY (s.event_types))
    ) THEN
        PERFORM pg_notify('outbox_events', '');
        PERFORM set_config('outbox.relays_notified', 'on', true);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER events_notify_relays ON outbox.events;
CREATE TRIGGER events_notify_relays
    AFTER INSERT ON outbox.events
    FOR EACH ROW
    WHEN (pg_sequence_last_value('outbox.relays_asleep') > 0
          AND current_setting('outbox.relays_notified', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION outbox.notify_relays();

-- Relays registered before this migration raise the flag now.
SELECT setval('outbox.relays_asleep',
              CASE WHEN EXISTS (SELECT 1 FROM outbox.sleeping_relays WHERE until > now())
                   THEN 1 ELSE 0 END);
