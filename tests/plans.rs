//! Every statement the relay runs is fast whatever the table's statistics say.
//!
//! A healthy outbox is usually empty when ANALYZE last saw it, and a relay reuses the plan it
//! made when it started. So each statement is prepared and first run on an empty, analyzed
//! outbox (autovacuum off, so the statistics stay those of the empty table), on a connection
//! set up as the relay sets up its own; then 20,000 pending rows arrive, and the kept plan
//! must still read a few index entries per row it touches: no sequential scan, no walk of a
//! whole index. Also: the lease reads no published history.

mod support;

use sqlx::{Connection, PgPool};
use support::plans::*;
use support::*;
use uuid::Uuid;

use outbox_runtime::__private::test_hooks as hooks;

/// Pending rows that arrive after the plans were made.
const PENDING: i64 = 20_000;
/// Of those, the rows a relay holds, which the acknowledgements and the renewal touch.
const HELD: usize = 200;
/// Index entries (or heap rows) a statement may read per row it touches.
const READS_PER_ROW: i64 = 4;

#[sqlx::test(migrations = false)]
async fn every_relay_statement_stays_fast_on_a_backlog_with_the_statistics_of_an_empty_outbox(
    pool: PgPool,
) {
    migrated(&pool).await;
    sqlx::raw_sql(
        "ALTER TABLE outbox.events SET (autovacuum_enabled = false); ANALYZE outbox.events",
    )
    .execute(&pool)
    .await
    .unwrap();

    let nothing = uuids(&[Uuid::now_v7()]);
    let zero = uuids(&[Uuid::nil()]);
    let lease_args = "100, gen_random_uuid(), 30000000, 10, false";
    let no_failure = format!("{nothing}, {zero}, '{{}}'");
    let mut statements = vec![
        Statement {
            name: "lease",
            sql: hooks::LEASE,
            parameters: LEASE_PARAMETERS,
            first: format!("{lease_args}, {FROM_HEAD}"),
            measured: format!("{lease_args}, {FROM_HEAD}"),
            touches: 100,
            local: None,
        },
        // Past a position: as a relay draining a backlog leases (here, the first rows' position).
        Statement {
            name: "lease_from",
            sql: hooks::LEASE,
            parameters: LEASE_PARAMETERS,
            first: format!("{lease_args}, {FROM_HEAD}"),
            measured: format!(
                "{lease_args}, '{{order}}', '{{order.placed}}', '{{\"\"}}', '{{1}}', '{{-infinity}}', \
                 '{{1}}', '{{}}'"
            ),
            touches: 100,
            local: None,
        },
        Statement {
            name: "lease_any",
            sql: hooks::LEASE_ANY,
            parameters: "bigint, uuid, bigint, int, bool, text[], text[], text[], int[], uuid[]",
            first: format!("{lease_args}, {ANY_TYPES}, '{{}}'"),
            measured: format!("{lease_args}, {ANY_TYPES}, '{{}}'"),
            touches: 100,
            local: None,
        },
        Statement {
            name: "lease_one",
            sql: hooks::LEASE_ONE,
            parameters: LEASE_PARAMETERS,
            first: format!("{lease_args}, {FROM_HEAD}"),
            measured: format!("{lease_args}, {FROM_HEAD}"),
            touches: 100,
            local: None,
        },
        Statement {
            name: "lease_one_from",
            sql: hooks::LEASE_ONE,
            parameters: LEASE_PARAMETERS,
            first: format!("{lease_args}, {FROM_HEAD}"),
            measured: format!(
                "{lease_args}, '{{order}}', '{{order.placed}}', '{{\"\"}}', '{{1}}', '{{-infinity}}', \
                 '{{1}}', '{{}}'"
            ),
            touches: 100,
            local: None,
        },
        Statement {
            name: "hold_one",
            sql: hooks::HOLD_ONE,
            parameters: HOLD_PARAMETERS,
            first: format!("{lease_args}, {HOLD_FROM_HEAD}"),
            measured: format!("{lease_args}, {HOLD_FROM_HEAD}"),
            touches: 100,
            local: None,
        },
        Statement {
            name: "hold",
            sql: hooks::HOLD,
            parameters: HOLD_PARAMETERS,
            first: format!("{lease_args}, {HOLD_FROM_HEAD}"),
            measured: format!("{lease_args}, {HOLD_FROM_HEAD}"),
            touches: 100,
            local: None,
        },
        Statement {
            name: "hold_any",
            sql: hooks::HOLD_ANY,
            parameters: "bigint, uuid, bigint, int, bool, text[], text[], text[], int[]",
            first: format!("{lease_args}, {ANY_TYPES}"),
            measured: format!("{lease_args}, {ANY_TYPES}"),
            touches: 100,
            local: None,
        },
        // The subscribers an ordered event waits for, on the application's pool (in an
        // indexes-only transaction, as the relay runs it).
        Statement {
            name: "behind",
            sql: hooks::BEHIND,
            parameters: "text, text, bool",
            first: "'order', '1', false".to_owned(),
            measured: "'order', '1', false".to_owned(),
            touches: 0,
            local: None,
        },
        Statement {
            name: "purge",
            sql: hooks::PURGE_PUBLISHED,
            parameters: "bigint, bigint",
            first: "3600000000, 1000".to_owned(),
            measured: "3600000000, 1000".to_owned(),
            touches: 1_000,
            local: None,
        },
    ];
    // The statements on held rows, measured below once the rows exist.
    let on_held: [(&str, &str, &str); 15] = [
        ("publish", hooks::PUBLISH, "uuid[], uuid[]"),
        ("publish_delete", hooks::PUBLISH_DELETE, "uuid[], uuid[]"),
        ("release", hooks::RELEASE, "uuid[], uuid[]"),
        ("renew", hooks::RENEW, "uuid[], uuid[], bigint"),
        ("still_leased", hooks::STILL_LEASED, "uuid[], uuid[]"),
        ("fail", hooks::FAIL, "uuid[], uuid[], jsonb"),
        ("snooze", hooks::SNOOZE, "uuid[], uuid[], jsonb"),
        ("fan_out", hooks::FAN_OUT, "uuid[], uuid[], jsonb"),
        ("fan_out_delete", hooks::FAN_OUT_DELETE, "uuid[], uuid[], jsonb"),
        ("publish_one", hooks::PUBLISH_ONE, "uuid, uuid"),
        ("publish_one_delete", hooks::PUBLISH_ONE_DELETE, "uuid, uuid"),
        ("held_publish", hooks::HELD_PUBLISH, "text[]"),
        ("held_publish_delete", hooks::HELD_PUBLISH_DELETE, "text[]"),
        ("held_fail", hooks::HELD_FAIL, "uuid[], jsonb"),
        ("held_snooze", hooks::HELD_SNOOZE, "uuid[], jsonb"),
    ];

    // The relay's connection, and a plain one for the transactional handler's acknowledgement.
    let mut relay = pool.acquire().await.unwrap().detach();
    let mut handler = pool.acquire().await.unwrap().detach();
    sqlx::raw_sql(hooks::RELAY_SESSION).execute(&mut relay).await.unwrap();
    // The worst case for the handler's connection: a plan made once and kept.
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan").execute(&mut handler).await.unwrap();
    let publish_one_local = "SET LOCAL enable_seqscan = off";

    // Plans made on the empty outbox, kept.
    for statement in &statements {
        let prepare =
            format!("PREPARE {}({}) AS {}", statement.name, statement.parameters, statement.sql);
        sqlx::raw_sql(sqlx::static_sql(prepare)).execute(&mut relay).await.unwrap();
        let first = format!("EXECUTE {}({})", statement.name, statement.first);
        sqlx::raw_sql(sqlx::static_sql(first)).execute(&mut relay).await.unwrap();
    }
    for (name, sql, parameters) in on_held {
        let conn = if name.starts_with("publish_one") { &mut handler } else { &mut relay };
        sqlx::raw_sql(sqlx::static_sql(format!("PREPARE {name}({parameters}) AS {sql}")))
            .execute(&mut *conn)
            .await
            .unwrap();
        let first = match name {
            "renew" => format!("{nothing}, {zero}, 1"),
            "fail" | "snooze" | "fan_out" | "fan_out_delete" => no_failure.clone(),
            "held_fail" | "held_snooze" => format!("{nothing}, '{{}}'"),
            "held_publish" | "held_publish_delete" => "'{}'".to_owned(),
            "publish_one" | "publish_one_delete" => {
                "gen_random_uuid(), gen_random_uuid()".to_owned()
            }
            _ => format!("{nothing}, {zero}"),
        };
        let mut tx = conn.begin().await.unwrap();
        if name.starts_with("publish_one") {
            sqlx::raw_sql(publish_one_local).execute(&mut *tx).await.unwrap();
        }
        let execute = sqlx::static_sql(format!("EXECUTE {name}({first})"));
        sqlx::raw_sql(execute).execute(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
    }

    // The backlog arrives, with a history to purge; a relay holds some of it.
    for _ in 0..PENDING / 5_000 {
        emit_committed(&pool, &(0..5_000).map(placed).collect::<Vec<_>>()).await;
    }
    sqlx::query(
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload, \
                                    published_at) \
         SELECT gen_random_uuid(), 'order', i::text, 'order.placed', '{\"n\": 1}', \
                now() - interval '2 days' \
         FROM generate_series(1, 20000) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let token = Uuid::new_v4();
    let held: Vec<Uuid> = sqlx::query_scalar(
        "UPDATE outbox.events SET lease_token = $1, available_at = now() + interval '1 hour' \
         WHERE event_id IN (SELECT event_id FROM outbox.events WHERE published_at IS NULL \
                            ORDER BY random() LIMIT $2) \
         RETURNING event_id",
    )
    .bind(token)
    .bind(HELD as i64)
    .fetch_all(&pool)
    .await
    .unwrap();
    let ids = uuids(&held);
    // Where the held rows lie, as a held transaction's outcomes find them.
    let addresses: Vec<String> =
        sqlx::query_scalar("SELECT ctid::text FROM outbox.events WHERE event_id = ANY($1)")
            .bind(&held)
            .fetch_all(&pool)
            .await
            .unwrap();
    let addresses = format!(
        "'{{{}}}'",
        addresses.iter().map(|a| format!("\"{a}\"")).collect::<Vec<_>>().join(",")
    );
    let tokens = uuids(&[token; HELD]);
    let errors: serde_json::Map<String, serde_json::Value> =
        held.iter().map(|id| (id.to_string(), serde_json::json!(["boom", 1000, 10]))).collect();
    let errors = serde_json::Value::Object(errors).to_string();
    let delays: serde_json::Map<String, serde_json::Value> =
        held.iter().map(|id| (id.to_string(), serde_json::json!(1000))).collect();
    let delays = serde_json::Value::Object(delays).to_string();
    // One subscriber took each event, another failed it and gets a copy.
    let outcomes: serde_json::Map<String, serde_json::Value> = held
        .iter()
        .map(|id| {
            let outcome = serde_json::json!({"receipts": null, "audit": ["boom", 1000, 1, false]});
            (id.to_string(), outcome)
        })
        .collect();
    let outcomes = serde_json::Value::Object(outcomes).to_string();
    for (name, sql, parameters) in on_held {
        let (measured, touches, local) = match name {
            "renew" => (format!("{ids}, {tokens}, 30000000"), HELD as i64, None),
            "fail" => (format!("{ids}, {tokens}, '{errors}'"), HELD as i64, None),
            "snooze" => (format!("{ids}, {tokens}, '{delays}'"), HELD as i64, None),
            "fan_out" | "fan_out_delete" => {
                (format!("{ids}, {tokens}, '{outcomes}'"), HELD as i64, None)
            }
            "held_fail" => (format!("{ids}, '{errors}'"), HELD as i64, None),
            "held_snooze" => (format!("{ids}, '{delays}'"), HELD as i64, None),
            "held_publish" | "held_publish_delete" => (addresses.clone(), HELD as i64, None),
            "publish_one" | "publish_one_delete" => {
                (format!("'{}', '{token}'", held[0]), 1, Some(publish_one_local))
            }
            _ => (format!("{ids}, {tokens}"), HELD as i64, None),
        };
        let first = String::new();
        statements.push(Statement { name, sql, parameters, first, measured, touches, local });
    }

    let mut report = Vec::new();
    for statement in &statements {
        let conn =
            if statement.name.starts_with("publish_one") { &mut handler } else { &mut relay };
        let plan = explain(conn, statement).await;
        let root = &plan[0]["Plan"];
        let read = rows_read(root);
        report.push(format!("{}: {read} rows read for {}", statement.name, statement.touches));
        assert!(!has_seq_scan(root), "{} scans the table: {plan:#}", statement.name);
        assert_eq!(touched(root), statement.touches, "{}: {plan:#}", statement.name);
        assert!(
            read <= READS_PER_ROW * statement.touches + 10,
            "{} read {read} rows to touch {}: {plan:#}",
            statement.name,
            statement.touches
        );
    }
    println!("{}", report.join("; "));
}

/// The parameter types of the lease statement.
const LEASE_PARAMETERS: &str = "bigint, uuid, bigint, int, bool, text[], text[], text[], int[], \
                                timestamptz[], int8[], uuid[]";

/// The parameter types of the held-transaction lease: the lease's but the held rows.
const HOLD_PARAMETERS: &str =
    "bigint, uuid, bigint, int, bool, text[], text[], text[], int[], timestamptz[], int8[]";

/// [`FROM_HEAD`] for the held-transaction lease, which takes no held rows.
const HOLD_FROM_HEAD: &str = "'{order}', '{order.placed}', '{\"\"}', '{1}', '{NULL}', '{NULL}'";

/// The lease of every type's arguments after `$5`: `order.placed` up to version 1.
const ANY_TYPES: &str = "'{order}', '{order.placed}', '{\"\"}', '{1}'";

/// The lease's arguments after `$5`: `order.placed` from the head of its pending rows.
const FROM_HEAD: &str = "'{order}', '{order.placed}', '{\"\"}', '{1}', '{NULL}', '{NULL}', '{}'";

/// The relay's default lease of up to 100 `order.placed` rows from the head.
const LEASE: &str = "100, gen_random_uuid(), 30000000, 10, false, '{order}', '{order.placed}', \
                     '{\"\"}', '{1}', '{NULL}', '{NULL}', '{}'";

/// Shared buffers the lease statement with these arguments reads to find its rows (the
/// `candidates` part, not the update), from `EXPLAIN (ANALYZE, BUFFERS)`.
async fn lease_buffers(pool: &PgPool, arguments: &str) -> i64 {
    let mut conn = pool.acquire().await.unwrap();
    sqlx::raw_sql(hooks::RELAY_SESSION).execute(&mut *conn).await.unwrap();
    let prepare = format!("PREPARE lease({LEASE_PARAMETERS}) AS {}", hooks::LEASE);
    sqlx::query(sqlx::static_sql(prepare)).execute(&mut *conn).await.unwrap();
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::static_sql(format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE lease({arguments})"
    )))
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    // The connection goes back to the pool, where the next call may get it again.
    sqlx::raw_sql("DEALLOCATE lease; RESET ALL").execute(&mut *conn).await.unwrap();
    let candidates = find_node(&plan[0]["Plan"], "CTE candidates").expect("a candidates CTE");
    candidates["Shared Hit Blocks"].as_i64().unwrap()
        + candidates["Shared Read Blocks"].as_i64().unwrap()
}

fn find_node<'a>(node: &'a serde_json::Value, subplan: &str) -> Option<&'a serde_json::Value> {
    if node["Subplan Name"] == subplan {
        return Some(node);
    }
    node["Plans"].as_array()?.iter().find_map(|child| find_node(child, subplan))
}

#[sqlx::test(migrations = false)]
async fn the_lease_reads_no_published_history(pool: PgPool) {
    migrated(&pool).await;
    emit_committed(&pool, &(0..100).map(placed).collect::<Vec<_>>()).await;
    let without_history = lease_buffers(&pool, LEASE).await;
    sqlx::query(
        "UPDATE outbox.events SET published_at = NULL, lease_token = NULL, available_at = now()",
    )
    .execute(&pool)
    .await
    .unwrap();

    // 200,000 published rows behind the same 100 pending ones.
    sqlx::query(
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload, \
                                    published_at) \
         SELECT gen_random_uuid(), 'order', i::text, 'order.placed', '{\"n\": 1}', now() \
         FROM generate_series(1, 200000) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE outbox.events").execute(&pool).await.unwrap();
    let table_pages: i64 = sqlx::query_scalar(
        "SELECT relpages::bigint FROM pg_class WHERE oid = 'outbox.events'::regclass",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let with_history = lease_buffers(&pool, LEASE).await;

    eprintln!("lease buffers: {without_history} without history, {with_history} with; table {table_pages} pages");
    assert!(table_pages > 2_000, "the history is large: {table_pages} pages");
    assert!(
        with_history <= 3 * 100 + 100 && with_history * 10 < table_pages,
        "the lease read {with_history} buffers with history ({without_history} without): it \
         should cost a few per pending row, whatever the history"
    );
}

/// Rows a relay drained leave their index entries dead at the head of the pending index until
/// vacuum: a lease from the head steps over all of them, a draining relay's lease from its
/// position over none.
#[sqlx::test(migrations = false)]
async fn a_draining_relay_leases_past_the_rows_it_drained(pool: PgPool) {
    migrated(&pool).await;
    sqlx::query("ALTER TABLE outbox.events SET (autovacuum_enabled = false)")
        .execute(&pool)
        .await
        .unwrap();
    for _ in 0..PENDING / 5_000 {
        emit_committed(&pool, &(0..5_000).map(placed).collect::<Vec<_>>()).await;
    }
    // Where the relay's last lease stopped, then the rows before it leased and published as a
    // relay leases them: moved to the lease deadline, then marked.
    let (at, seq): (String, i64) = sqlx::query_as(
        "SELECT available_at::text, seq FROM outbox.events ORDER BY seq OFFSET $1 LIMIT 1",
    )
    .bind(PENDING * 3 / 4 - 1)
    .fetch_one(&pool)
    .await
    .unwrap();
    for set in [
        "lease_token = gen_random_uuid(), available_at = now() + interval '30 seconds'",
        "published_at = now()",
    ] {
        let drain = format!("UPDATE outbox.events SET {set} WHERE seq <= $1");
        sqlx::query(sqlx::static_sql(drain)).bind(seq).execute(&pool).await.unwrap();
    }

    let from_position = format!(
        "100, gen_random_uuid(), 30000000, 10, false, '{{order}}', '{{order.placed}}', \
         '{{\"\"}}', '{{1}}', '{{\"{at}\"}}', '{{{seq}}}', '{{}}'"
    );
    let past = lease_buffers(&pool, &from_position).await;
    let from_head = lease_buffers(&pool, LEASE).await;
    let leased: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.events WHERE published_at IS NULL AND lease_token IS NOT NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    eprintln!("lease buffers past {seq} drained rows: {past} from the position, {from_head} from the head");
    assert_eq!(leased, 200, "each lease took 100 rows");
    assert!(
        past <= 3 * 100 + 100 && past * 5 < from_head,
        "the lease past the position read {past} buffers, from the head {from_head}"
    );
}

/// Event types of the many-types plan test.
const TYPES: usize = 50;

/// Rows locked by every `LockRows` node of a JSON plan (its rows per loop, rounded, times loops).
fn rows_locked(node: &serde_json::Value) -> i64 {
    let own = if node["Node Type"] == "LockRows" {
        node["Actual Rows"].as_i64().unwrap_or(0) * node["Actual Loops"].as_i64().unwrap_or(1)
    } else {
        0
    };
    own + node["Plans"].as_array().map_or(0, |children| children.iter().map(rows_locked).sum())
}

/// A lease over 50 types with a backlog in each, planned on an empty outbox: it stays on the
/// indexes, and locks the rows it leases, not its limit in each type (the first version locked
/// 50,000 rows to lease 1,000, a WAL record each). The relay's lease of every type too.
#[sqlx::test(migrations = false)]
async fn a_lease_over_many_types_locks_only_what_it_leases_on_the_plan_of_an_empty_outbox(
    pool: PgPool,
) {
    migrated(&pool).await;
    sqlx::raw_sql(
        "ALTER TABLE outbox.events SET (autovacuum_enabled = false); ANALYZE outbox.events",
    )
    .execute(&pool)
    .await
    .unwrap();
    let names: Vec<String> = (0..TYPES).map(|t| format!("account.t{t:02}")).collect();
    let list = |items: &[String]| format!("'{{{}}}'", items.join(","));
    let aggregates = list(&vec!["account".to_owned(); TYPES]);
    let versions = list(&vec!["1".to_owned(); TYPES]);
    let emitted = list(&vec!["\"\"".to_owned(); TYPES]);
    let nulls = list(&vec!["NULL".to_owned(); TYPES]);
    let limit = 1_000;
    let args = format!("{limit}, gen_random_uuid(), 30000000, 10, false");
    let names = list(&names);
    let lease =
        format!("{args}, {aggregates}, {names}, {emitted}, {versions}, {nulls}, {nulls}, '{{}}'");
    let lease_any = format!("{args}, {aggregates}, {names}, {emitted}, {versions}, '{{}}'");
    let statements = [
        ("lease", hooks::LEASE, LEASE_PARAMETERS, lease),
        (
            "lease_any",
            hooks::LEASE_ANY,
            "bigint, uuid, bigint, int, bool, text[], text[], text[], int[], uuid[]",
            lease_any,
        ),
    ];

    let mut relay = pool.acquire().await.unwrap().detach();
    sqlx::raw_sql(hooks::RELAY_SESSION).execute(&mut relay).await.unwrap();
    for (name, sql, parameters, arguments) in &statements {
        let prepare = format!("PREPARE {name}({parameters}) AS {sql}");
        sqlx::raw_sql(sqlx::static_sql(prepare)).execute(&mut relay).await.unwrap();
        let first = format!("EXECUTE {name}({arguments})");
        sqlx::raw_sql(sqlx::static_sql(first)).execute(&mut relay).await.unwrap();
    }
    // 400 rows of each type, the types taking turns.
    sqlx::query(
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload) \
         SELECT gen_random_uuid(), 'account', i::text, \
                'account.t' || lpad((i % $1)::text, 2, '0'), '{\"n\": 1}' \
         FROM generate_series(0, $1 * 400 - 1) AS i",
    )
    .bind(TYPES as i32)
    .execute(&pool)
    .await
    .unwrap();

    for (name, sql, parameters, measured) in statements {
        let statement = Statement {
            name,
            sql,
            parameters,
            first: String::new(),
            measured,
            touches: limit,
            local: None,
        };
        let plan = explain(&mut relay, &statement).await;
        let root = &plan[0]["Plan"];
        let (read, locked) = (rows_read(root), rows_locked(root));
        eprintln!("{name} over {TYPES} types: {read} rows read, {locked} locked for {limit}");
        assert!(!has_seq_scan(root), "{name} scans the table: {plan:#}");
        assert_eq!(touched(root), limit, "{name}: {plan:#}");
        // Each lock node's rows per loop are rounded: half a row per type either way.
        assert!(locked <= limit + TYPES as i64 / 2, "{name} locked {locked} rows: {plan:#}");
        assert!(
            read <= READS_PER_ROW * limit + 10,
            "{name} read {read} rows to touch {limit}: {plan:#}"
        );
    }
}
