-- Producers outside Rust: a trigger on a business table, a service in another language, a
-- migration script. The reference design's INSERT names no `event_id`, which had no default, so
-- it failed; now the database makes the id, time-ordered like the Rust side's. `outbox.emit`
-- writes an event by the same rules as Rust's `emit` (names, headers, versions, ordering locks,
-- idempotency keys), so events from SQL and from Rust mix in one outbox and one order.

-- A version 7 UUID (RFC 9562), laid out as PostgreSQL 18's `uuidv7()`, which 15 lacks: 48 bits
-- of Unix milliseconds, the version, 12 bits of sub-millisecond fraction (the RFC's method 3:
-- the clock has microseconds, so ids sort by time to the microsecond; with the Rust side's
-- `Uuid::now_v7()`, to the millisecond), then the variant and random bits of a version 4 UUID.
-- Ids made in the same microsecond are in random order; `seq` is the insertion order. A
-- standard SQL body: its names are bound when it is created, so no caller's search_path can
-- change what it calls, and calls pay no search_path switch.
CREATE FUNCTION outbox.uuid_v7() RETURNS uuid
    LANGUAGE sql VOLATILE PARALLEL SAFE
BEGIN ATOMIC
    SELECT encode(substring(int8send(t.micros / 1000) FROM 3)          -- 6 bytes: millis
                  -- 2 bytes: version 7 (0x7000), then the fraction in 4096ths of a millisecond
                  || int2send((28672 + t.micros % 1000 * 4096 / 1000)::int2)
                  || substring(uuid_send(gen_random_uuid()) FROM 9),  -- variant, random
                  'hex')::uuid
    FROM (SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8 AS micros) AS t;
END;

ALTER TABLE outbox.events ALTER COLUMN event_id SET DEFAULT outbox.uuid_v7();

-- Writes one event inside the caller's transaction (it never commits, so a trigger can call it)
-- and returns its id. The checks are the Rust emit's; each refusal raises SQLSTATE 22023
-- (invalid_parameter_value) naming the argument, and writes nothing. Payloads and header values
-- never appear in a message: errors reach logs.
--
-- SECURITY INVOKER: it can do nothing its caller could not do with a plain INSERT, so granting
-- EXECUTE grants no power, and one set of grants serves the Rust and the SQL emit alike. A
-- definer function would let roles without INSERT write events, but also let any role that can
-- call it write events of every type under the owner's rights.
CREATE FUNCTION outbox.emit(
    aggregate_type  text,
    aggregate_id    text,
    event_type      text,
    payload         jsonb,
    headers         jsonb       DEFAULT '{}',
    ordered         boolean     DEFAULT false,
    event_version   integer     DEFAULT 1,
    idempotency_key text        DEFAULT NULL,
    available_at    timestamptz DEFAULT now()
) RETURNS uuid
    LANGUAGE plpgsql VOLATILE SECURITY INVOKER SET search_path = pg_catalog, pg_temp AS $$
-- The parameters are named after the columns, for callers' named arguments; they are always
-- written `emit.<name>` below, so a bare name (the ON CONFLICT target) is the column.
#variable_conflict use_column
DECLARE
    grammar constant text :=
        'use lowercase letters, digits, "_", "." and "-", starting with a letter';
    arg text;
    given text;
    new_id uuid;
    stored_id uuid;
BEGIN
    -- The derive's grammar (outbox-macros/src/name.rs), so a Rust type can declare these names.
    FOREACH arg IN ARRAY ARRAY['aggregate_type', 'event_type'] LOOP
        given := CASE arg WHEN 'aggregate_type' THEN emit.aggregate_type ELSE emit.event_type END;
        IF given IS NULL OR given COLLATE "C" !~ '^[a-z][a-z0-9_.-]*$' THEN
            RAISE EXCEPTION 'outbox.emit: invalid % %: %', arg, quote_nullable(given), grammar
                USING ERRCODE = 'invalid_parameter_value';
        ELSIF char_length(given) > 128 THEN
            RAISE EXCEPTION 'outbox.emit: % is % characters long, the maximum is 128',
                arg, char_length(given) USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    arg := CASE
        WHEN emit.aggregate_id IS NULL THEN 'aggregate_id'
        WHEN emit.payload IS NULL THEN 'payload'
        WHEN emit.ordered IS NULL THEN 'ordered'
        WHEN emit.available_at IS NULL THEN 'available_at'
    END;
    IF arg IS NOT NULL THEN
        RAISE EXCEPTION 'outbox.emit: % cannot be NULL', arg
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Handlers read headers as an object (`EventContext::headers`), and so do forwarders.
    IF jsonb_typeof(emit.headers) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'outbox.emit: headers must be a JSON object, not %',
            coalesce('a JSON ' || jsonb_typeof(emit.headers), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF emit.event_version IS NULL OR emit.event_version < 1 THEN
        RAISE EXCEPTION 'outbox.emit: event_version must be at least 1, not %',
            coalesce(emit.event_version::text, 'NULL') USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Exactly the Rust emit's lock key (outbox-runtime/src/store/emit.rs), taken before the row
    -- draws its `seq`: SQL and Rust producers of one aggregate queue on the same lock, so `seq`
    -- is commit order across both.
    IF emit.ordered THEN
        PERFORM pg_advisory_xact_lock(
            hashtextextended(emit.aggregate_type || '/' || emit.aggregate_id, 0));
    END IF;

    new_id := outbox.uuid_v7();
    -- Without a key nothing can conflict: a plain insert spares ON CONFLICT's speculative
    -- insertion, as the Rust emit does.
    IF emit.idempotency_key IS NULL THEN
        INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type,
                                   event_version, payload, headers, available_at, ordered)
        VALUES (new_id, emit.aggregate_type, emit.aggregate_id, emit.event_type,
                emit.event_version, emit.payload, emit.headers, emit.available_at, emit.ordered);
        RETURN new_id;
    END IF;
    -- A key stored by a transaction still open makes this insert wait for it to end; once it
    -- committed, its event stands for this one.
    INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, event_version,
                               payload, headers, available_at, ordered, idempotency_key)
    VALUES (new_id, emit.aggregate_type, emit.aggregate_id, emit.event_type, emit.event_version,
            emit.payload, emit.headers, emit.available_at, emit.ordered, emit.idempotency_key)
    ON CONFLICT (aggregate_type, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;
    IF FOUND THEN
        RETURN new_id;
    END IF;
    -- A new statement, a new snapshot (at READ COMMITTED): the winner's row is visible.
    SELECT e.event_id INTO STRICT stored_id FROM outbox.events AS e
    WHERE e.aggregate_type = emit.aggregate_type AND e.idempotency_key = emit.idempotency_key;
    RETURN stored_id;
END
$$;
