//! Every statement behind the console's pages (and `outbox status`, `outbox dead ...`, `outbox
//! event show`, `outbox replay --dry-run`) stays index-driven on a 1,000,000-row outbox whatever
//! its statistics say: prepared and first run on an empty, analyzed outbox with generic plans
//! forced (the worst a kept plan can be), then run on a million rows, each statement reads a
//! bounded multiple of the rows it must look at (the dead letters it filters, the pending rows it
//! counts), never the published history, and scans no table.

mod support;

use outbox_runtime::__private::test_hooks as hooks;
use sqlx::PgPool;
use support::plans::*;
use support::*;
use uuid::Uuid;

const ROWS: i64 = 1_000_000;
/// Every 200th row is dead, the next pending; the rest are published over two days.
const DEAD_ROWS: i64 = ROWS / 200;
/// Index entries (or heap rows) a statement may read per row it must look at.
const READS_PER_ROW: i64 = 4;

const SELECTION: &str = "text, text, uuid, text, timestamptz, timestamptz, text";

/// Fills the outbox: dead rows dying over the last day (one in five with a timeout), pending
/// rows, and published rows over the last two days, of two ordered types, ids in time order,
/// 10,000 aggregates of 100 events (`order`/`1`: all pending).
const FILL: &str = "
    INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload,
                               headers, created_at, available_at, published_at, dead_at,
                               attempts, last_error, ordered)
    SELECT outbox.uuid_v7(), t.aggregate_type, (i % 5000)::text, t.event_type, '{}', '{}',
           now() - interval '3 days', now(),
           CASE WHEN i % 200 > 1 THEN now() - (i % 2880) * interval '1 minute' END,
           CASE WHEN i % 200 = 0 THEN now() - (i % 1440) * interval '1 minute' END,
           CASE WHEN i % 200 = 0 THEN 10 ELSE 0 END,
           CASE WHEN i % 1000 = 0 THEN 'Timeout after 30s'
                WHEN i % 200 = 0 THEN 'refused by the downstream' END,
           true
    FROM generate_series(1, 1000000) AS i,
         LATERAL (SELECT CASE WHEN i % 400 < 200 THEN 'order' ELSE 'customer' END AS aggregate_type,
                         CASE WHEN i % 400 < 200 THEN 'order.placed' ELSE 'customer.renamed' END
                             AS event_type) AS t;
    INSERT INTO outbox.activity (minute, delivered, pending, dead, read)
    SELECT date_trunc('minute', now()) - m * interval '1 minute', 700, 5000, 5000, true
    FROM generate_series(0, 1439) AS m;
";

async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::static_sql(sql.to_owned())).fetch_one(pool).await.unwrap()
}

async fn one_id(pool: &PgPool, condition: &str) -> Uuid {
    let sql = format!("SELECT event_id FROM outbox.events WHERE {condition} LIMIT 1");
    sqlx::query_scalar(sqlx::static_sql(sql)).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrations = false)]
async fn every_operations_statement_stays_index_driven_on_a_million_rows_with_empty_statistics(
    pool: PgPool,
) {
    migrated(&pool).await;
    // The optional index the aggregate page reads every event on (events::AGGREGATE_INDEX).
    sqlx::raw_sql(
        "CREATE INDEX events_by_aggregate ON outbox.events (aggregate_type, aggregate_id, seq); \
         ALTER TABLE outbox.events SET (autovacuum_enabled = false); \
         ALTER TABLE outbox.activity SET (autovacuum_enabled = false); \
         ANALYZE outbox.events; ANALYZE outbox.activity",
    )
    .execute(&pool)
    .await
    .unwrap();
    let nil = Uuid::nil();
    let nothing = "NULL, NULL, NULL, NULL, NULL, NULL, NULL";
    // (name, SQL, parameter types, arguments on the empty outbox)
    let prepared: [(&str, &str, String, String); 17] = [
        (
            "dead_page",
            hooks::DEAD[0],
            format!("{SELECTION}, uuid, bigint"),
            format!("{nothing}, NULL, 50"),
        ),
        (
            "dead_one",
            hooks::DEAD[1],
            format!("{SELECTION}, uuid, bigint"),
            format!("NULL, NULL, '{nil}', NULL, NULL, NULL, NULL, NULL, 50"),
        ),
        ("count_dead", hooks::COUNT_DEAD[0], SELECTION.into(), nothing.into()),
        (
            "count_dead_one",
            hooks::COUNT_DEAD[1],
            SELECTION.into(),
            format!("NULL, NULL, '{nil}', NULL, NULL, NULL, NULL"),
        ),
        (
            "requeue",
            hooks::REQUEUE[0],
            SELECTION.into(),
            "NULL, NULL, NULL, 'no such error', NULL, NULL, NULL".into(),
        ),
        (
            "requeue_one",
            hooks::REQUEUE[1],
            SELECTION.into(),
            format!("NULL, NULL, '{nil}', NULL, NULL, NULL, NULL"),
        ),
        (
            "discard",
            hooks::DISCARD[0],
            SELECTION.into(),
            "NULL, NULL, NULL, 'no such error', NULL, NULL, NULL".into(),
        ),
        ("event", hooks::EVENT, "uuid".into(), format!("'{nil}'")),
        (
            "aggregate",
            hooks::AGGREGATE_ALL,
            "text, text, bigint".into(),
            "'order', '1', 200".into(),
        ),
        (
            "aggregate_undelivered",
            hooks::AGGREGATE_UNDELIVERED,
            "text, text, bigint".into(),
            "'order', '1', 200".into(),
        ),
        ("stats", hooks::STATS, String::new(), String::new()),
        ("activity", hooks::ACTIVITY, "timestamptz".into(), "now() - interval '1 day'".into()),
        (
            "count_published",
            hooks::COUNT_PUBLISHED,
            "text, text, timestamptz, timestamptz".into(),
            "'order', 'order.placed', now() - interval '1 hour', now()".into(),
        ),
        (
            "replay",
            hooks::REPLAY,
            "text, text, timestamptz, timestamptz".into(),
            "'order', 'order.placed', now() - interval '1 hour', now()".into(),
        ),
        (
            "replay_to",
            hooks::REPLAY_TO,
            "text, text, timestamptz, timestamptz, text".into(),
            "'order', 'order.placed', now() - interval '1 hour', now(), 'audit'".into(),
        ),
        ("subscribers", hooks::SUBSCRIBERS, String::new(), String::new()),
        ("remove_subscriber", hooks::REMOVE_SUBSCRIBER, "text".into(), "'audit'".into()),
    ];
    let mut conn = pool.acquire().await.unwrap().detach();
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan").execute(&mut conn).await.unwrap();
    // Each plan is made at its first run, in a transaction of the operations' own.
    for (name, sql, parameters, first) in &prepared {
        let parameters =
            if parameters.is_empty() { String::new() } else { format!("({parameters})") };
        let first = if first.is_empty() { String::new() } else { format!("({first})") };
        let prepare = format!("PREPARE {name}{parameters} AS {sql}");
        sqlx::raw_sql(sqlx::static_sql(prepare)).execute(&mut conn).await.unwrap();
        let run = format!("BEGIN; {}; EXECUTE {name}{first}; ROLLBACK", hooks::INDEXES_ONLY);
        sqlx::raw_sql(sqlx::static_sql(run)).execute(&mut conn).await.unwrap();
    }

    sqlx::raw_sql(FILL).execute(&pool).await.unwrap();
    let dead_id = one_id(&pool, "dead_at IS NOT NULL").await;
    let published_id = one_id(&pool, "published_at IS NOT NULL").await;
    let pending = scalar(
        &pool,
        "SELECT count(*) FROM outbox.events WHERE published_at IS NULL AND dead_at IS NULL",
    )
    .await;
    let dead_last_hour = scalar(
        &pool,
        "SELECT count(*) FROM outbox.events WHERE dead_at >= now() - interval '1 hour'",
    )
    .await;
    let timeouts_last_hour = scalar(
        &pool,
        "SELECT count(*) FROM outbox.events WHERE dead_at >= now() - interval '1 hour' \
         AND aggregate_type = 'order' AND last_error ILIKE '%timeout%'",
    )
    .await;
    let published_last_hour = scalar(
        &pool,
        "SELECT count(*) FROM outbox.events WHERE published_at >= now() - interval '1 hour'",
    )
    .await;
    let placed_last_hour = scalar(
        &pool,
        "SELECT count(*) FROM outbox.events WHERE published_at >= now() - interval '1 hour' \
         AND event_type = 'order.placed'",
    )
    .await;
    assert_eq!(scalar(&pool, "SELECT count(*) FROM outbox.events").await, ROWS);
    assert!(timeouts_last_hour > 0 && dead_last_hour > timeouts_last_hour);

    let recent_timeouts = "'order', NULL, NULL, 'TIMEOUT', now() - interval '1 hour', NULL, NULL";
    let dead_one = format!("NULL, NULL, '{dead_id}', NULL, NULL, NULL, NULL");
    // Two subscribers registered (none has copies in this outbox).
    sqlx::query(
        "INSERT INTO outbox.subscribers (aggregate_type, event_type, subscriber) \
         VALUES ('order', 'order.placed', 'audit'), ('order', 'order.placed', 'receipts')",
    )
    .execute(&pool)
    .await
    .unwrap();
    // (name, arguments, rows it returns or changes, rows it must look at)
    let measured: [(&str, String, i64, i64); 18] = [
        ("dead_page", format!("{nothing}, NULL, 50"), 50, DEAD_ROWS),
        (
            "dead_page",
            format!("{recent_timeouts}, NULL, 50"),
            timeouts_last_hour.min(50),
            dead_last_hour,
        ),
        ("dead_one", format!("{dead_one}, NULL, 50"), 1, 1),
        ("count_dead", nothing.into(), 1, DEAD_ROWS),
        ("count_dead", recent_timeouts.into(), 1, dead_last_hour),
        ("count_dead_one", dead_one.clone(), 1, 1),
        ("requeue", recent_timeouts.into(), timeouts_last_hour, dead_last_hour),
        ("requeue_one", dead_one.clone(), 1, 1),
        ("discard", recent_timeouts.into(), timeouts_last_hour, dead_last_hour),
        ("event", format!("'{published_id}'"), 1, 1),
        ("aggregate", "'order', '2', 200".into(), 100, 100),
        ("aggregate_undelivered", "'order', '1', 200".into(), 100, 100),
        ("stats", String::new(), 2, pending + DEAD_ROWS),
        (
            "count_published",
            "'order', 'order.placed', now() - interval '1 hour', now()".into(),
            1,
            published_last_hour,
        ),
        (
            "replay",
            "'order', 'order.placed', now() - interval '1 hour', now()".into(),
            placed_last_hour,
            published_last_hour,
        ),
        (
            "replay_to",
            "'order', 'order.placed', now() - interval '1 hour', now(), 'audit'".into(),
            placed_last_hour,
            published_last_hour,
        ),
        ("subscribers", String::new(), 2, DEAD_ROWS + 2),
        ("remove_subscriber", "'audit'".into(), 1, DEAD_ROWS + 1),
    ];
    assert!(placed_last_hour > 0);
    let mut report = Vec::new();
    for (name, arguments, touches, looks_at) in measured {
        let (_, sql, parameters, _) = prepared.iter().find(|(each, ..)| *each == name).unwrap();
        let statement = Statement {
            name,
            sql,
            parameters: "",
            first: String::new(),
            measured: arguments,
            touches,
            local: Some(hooks::INDEXES_ONLY),
        };
        let _ = parameters;
        let plan = explain(&mut conn, &statement).await;
        let root = &plan[0]["Plan"];
        let read = rows_read(root);
        report.push(format!("{name}: {read} rows read for {touches} (looks at {looks_at})"));
        assert!(!has_seq_scan(root), "{name} scans a table: {plan:#}");
        assert_eq!(touched(root), touches, "{name}: {plan:#}");
        assert!(
            read <= READS_PER_ROW * looks_at + 10,
            "{name} read {read} rows for {looks_at} it must look at: {plan:#}"
        );
    }
    // The charts' day: 1,440 minutes, on the primary key.
    let statement = Statement {
        name: "activity",
        sql: hooks::ACTIVITY,
        parameters: "",
        first: String::new(),
        measured: "now() - interval '1 day'".into(),
        touches: 1440,
        local: Some(hooks::INDEXES_ONLY),
    };
    let plan = explain(&mut conn, &statement).await;
    assert!(!has_seq_scan(&plan[0]["Plan"]), "{plan:#}");
    assert!(rows_read(&plan[0]["Plan"]) <= 1441, "{plan:#}");
    println!("{}", report.join("; "));
}
