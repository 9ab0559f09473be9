//! Least privilege: `docs/least-privilege.sql` applied to fresh roles, then emit, the relay and the
//! operations run under them (emit from Rust and from SQL), and everything the roles should not
//! do is refused.
//!
//! Roles are cluster-wide and tests run in parallel, so each test creates its roles under unique
//! names (the script's placeholders substituted) and drops them when it ends, even on panic.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use outbox_runtime::dead_letters::{self, DeadFilter};
use outbox_runtime::{
    emit, emit_all, emit_idempotent, emit_with, EmitOptions, Emitted, Error, EventContext, Relay,
    TransactionContext,
};
use outbox_runtime::{pauses, replay};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use support::accounts::Posted;
use support::*;
use uuid::Uuid;

/// The grants script, as shipped.
const SCRIPT: &str = include_str!("../docs/least-privilege.sql");

/// SQLSTATE `insufficient_privilege`.
const PERMISSION_DENIED: &str = "42501";

/// The script's three roles under names unique to one test. Dropped (with everything they own
/// or were granted in the test database) when this goes out of scope.
struct Roles {
    owner: String,
    app: String,
    relay: String,
    /// The superuser's connect options for the test database.
    admin: PgConnectOptions,
}

impl Roles {
    /// Creates the roles and grants them database access: the script's `roles` and `database`
    /// steps, as the superuser.
    async fn create(pool: &PgPool) -> Roles {
        let suffix = &Uuid::new_v4().simple().to_string()[..12];
        let roles = Roles {
            owner: format!("outbox_owner_{suffix}"),
            app: format!("outbox_app_{suffix}"),
            relay: format!("outbox_relay_{suffix}"),
            admin: (*pool.connect_options()).clone(),
        };
        roles.run_step(pool, "roles").await;
        roles.run_step(pool, "database").await;

        let privileged: Vec<String> = sqlx::query_scalar(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY($1) \
             AND (rolsuper OR rolcreaterole OR rolcreatedb OR rolreplication OR rolbypassrls)",
        )
        .bind([&roles.owner, &roles.app, &roles.relay])
        .fetch_all(pool)
        .await
        .unwrap();
        assert!(privileged.is_empty(), "no role has a special attribute: {privileged:?}");
        roles
    }

    /// One step of the script (from its `-- step: <name>` line to the next), with this test's
    /// role names.
    fn step(&self, name: &str) -> String {
        let marker = format!("-- step: {name}\n");
        let start = SCRIPT.find(&marker).unwrap_or_else(|| panic!("no step {name:?}"));
        let rest = &SCRIPT[start + marker.len()..];
        let end = rest.find("-- step: ").unwrap_or(rest.len());
        rest[..end]
            .replace("outbox_owner", &self.owner)
            .replace("outbox_app", &self.app)
            .replace("outbox_relay", &self.relay)
    }

    async fn run_step(&self, pool: &PgPool, name: &str) {
        let sql = self.step(name);
        let sql = sqlx::static_sql(sql);
        sqlx::raw_sql(sql).execute(pool).await.unwrap_or_else(|e| panic!("step {name}: {e}"));
    }

    /// A pool logged in as `role` (trust authentication: only the user name changes).
    async fn pool_as(&self, pool: &PgPool, role: &str) -> PgPool {
        let options = (*pool.connect_options()).clone().username(role);
        let pool = PgPoolOptions::new().max_connections(3).connect_with(options).await.unwrap();
        let user: String =
            sqlx::query_scalar("SELECT current_user").fetch_one(&pool).await.unwrap();
        assert_eq!(user, role);
        pool
    }
}

impl Drop for Roles {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let names = format!("\"{}\", \"{}\", \"{}\"", self.owner, self.app, self.relay);
        // Drop runs inside the test's runtime, which must not block on itself: clean up from a
        // thread of its own.
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async move {
                let mut conn = PgConnection::connect_with(&admin).await?;
                let sql = format!(
                    "REASSIGN OWNED BY {names} TO CURRENT_USER; DROP OWNED BY {names}; \
                     DROP ROLE {names};"
                );
                sqlx::raw_sql(sqlx::static_sql(sql)).execute(&mut conn).await?;
                conn.close().await?;
                Ok::<_, sqlx::Error>(())
            })?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        });
        match cleanup.join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) if std::thread::panicking() => eprintln!("dropping roles: {error}"),
            Ok(Err(error)) => panic!("dropping roles {}: {error}", self.owner),
            Err(_) => eprintln!("dropping roles {} panicked", self.owner),
        }
    }
}

/// Who runs `outbox_runtime::migrate`.
enum Migrator {
    Superuser,
    Owner,
}

/// Fresh roles with every step of the script applied, the schema migrated by `migrator`.
async fn setup(pool: &PgPool, migrator: Migrator) -> Roles {
    let roles = Roles::create(pool).await;
    match migrator {
        Migrator::Superuser => {
            migrated(pool).await;
            roles.run_step(pool, "objects").await;
        }
        Migrator::Owner => {
            let owner = roles.pool_as(pool, &roles.owner).await;
            outbox_runtime::migrate(&owner).await.expect("the owner role migrates");
            outbox_runtime::migrate(&owner).await.expect("and migrates again");
            roles.run_step(&owner, "objects").await;
            owner.close().await;
        }
    }
    roles
}

fn assert_denied<T: std::fmt::Debug>(what: &str, result: Result<T, sqlx::Error>) {
    match result {
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(PERMISSION_DENIED) => {}
        other => panic!("{what}: expected permission denied (42501), got {other:?}"),
    }
}

fn assert_op_denied<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) {
    match result {
        Err(Error::Database(error)) => assert_denied(what, Err::<T, _>(error)),
        other => panic!("{what}: expected a permission-denied database error, got {other:?}"),
    }
}

async fn execute(pool: &PgPool, sql: &'static str) -> Result<u64, sqlx::Error> {
    sqlx::query(sql).execute(pool).await.map(|done| done.rows_affected())
}

// ---------------------------------------------------------------------------------------------
// The application role
// ---------------------------------------------------------------------------------------------

#[sqlx::test(migrations = false)]
async fn the_app_role_can_emit_every_way(pool: PgPool) {
    let roles = setup(&pool, Migrator::Superuser).await;
    let app = roles.pool_as(&pool, &roles.app).await;

    let mut tx = app.begin().await.unwrap();
    let plain = emit(&mut tx, &placed(1)).await.expect("plain emit");
    let delayed = emit_with(
        &mut tx,
        &placed(2),
        EmitOptions::new().delay(Duration::from_secs(60)).header("request_id", "r-1"),
    )
    .await
    .expect("delayed emit with a header");
    let at = Utc::now() + chrono::Duration::hours(1);
    let scheduled = emit_with(&mut tx, &placed(3), EmitOptions::new().available_at(at))
        .await
        .expect("scheduled emit");
    let batch = emit_all(&mut tx, &[placed(4), placed(5)]).await.expect("batch emit");
    let ordered = [Posted { account: 1, n: 1 }, Posted { account: 1, n: 2 }];
    let ordered = emit_all(&mut tx, &ordered).await.expect("ordered emit (advisory locks)");
    let keyed = emit_idempotent(&mut tx, &placed(6), "cmd-1", EmitOptions::new())
        .await
        .expect("keyed emit");
    assert!(keyed.is_written(), "{keyed:?}");
    let duplicate = emit_idempotent(&mut tx, &placed(7), "cmd-1", EmitOptions::new())
        .await
        .expect("duplicate key in the same transaction");
    assert_eq!(duplicate, Emitted::Found(keyed.event_id()));
    tx.commit().await.unwrap();

    // In later transactions: the duplicate key is found by emit's lookup; ordered emits of the
    // same aggregate queue behind each other's lock.
    let mut tx = app.begin().await.unwrap();
    let again = emit_idempotent(&mut tx, &placed(8), "cmd-1", EmitOptions::new())
        .await
        .expect("duplicate key in a later transaction");
    assert_eq!(again, Emitted::Found(keyed.event_id()));
    let third = emit(&mut tx, &Posted { account: 1, n: 3 }).await.unwrap();
    tx.commit().await.unwrap();
    // A rolled-back emit leaves nothing, under the app role as under any.
    let mut tx = app.begin().await.unwrap();
    emit(&mut tx, &placed(9)).await.unwrap();
    tx.rollback().await.unwrap();

    // What was written, read as the superuser.
    let rows: Vec<(Uuid, i64, bool, bool, Option<String>)> = sqlx::query_as(
        "SELECT event_id, coalesce((payload->>'total_cents')::bigint, (payload->>'n')::bigint), \
                ordered, available_at > now(), idempotency_key \
         FROM outbox.events ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let expected = [
        (plain, 1, false, false, None),
        (delayed, 2, false, true, None),
        (scheduled, 3, false, true, None),
        (batch[0], 4, false, false, None),
        (batch[1], 5, false, false, None),
        (ordered[0], 1, true, false, None),
        (ordered[1], 2, true, false, None),
        (keyed.event_id(), 6, false, false, Some("cmd-1".to_owned())),
        (third, 3, true, false, None),
    ];
    assert_eq!(rows, expected);
    let headers: serde_json::Value =
        sqlx::query_scalar("SELECT headers FROM outbox.events WHERE event_id = $1")
            .bind(delayed)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(headers, serde_json::json!({ "request_id": "r-1" }));

    // Without any privilege on the identity sequence or the trigger functions, and reading the
    // wake-up flag only.
    let (sequence, functions, flag): (bool, bool, bool) = sqlx::query_as(
        "SELECT has_sequence_privilege($1, 'outbox.events_seq_seq', 'USAGE, SELECT, UPDATE'), \
                has_function_privilege($1, 'outbox.notify_relays()', 'EXECUTE') \
                  OR has_function_privilege($1, 'outbox.flag_relays_asleep()', 'EXECUTE'), \
                has_sequence_privilege($1, 'outbox.relays_asleep', 'USAGE, UPDATE')",
    )
    .bind(&roles.app)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((sequence, functions, flag), (false, false, false));
    app.close().await;
}

/// The application's own business table, whose trigger emits from SQL (`outbox.emit`, ordered)
/// in the inserting transaction, as the role that inserts.
const ORDERS: &str = "
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, total_cents bigint NOT NULL);
CREATE FUNCTION orders_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM outbox.emit(
        aggregate_type => 'order', aggregate_id => NEW.id::text,
        event_type => 'order.status_changed',
        payload => jsonb_build_object('order_id', NEW.id, 'status', NEW.status),
        headers => jsonb_build_object('table', TG_TABLE_NAME),
        ordered => true);
    RETURN NULL;
END
$$;
CREATE TRIGGER orders_outbox AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION orders_outbox();
";

/// An inbox message for `event`, as a forwarding relay sends it.
fn inbound(event: &OrderPlaced) -> outbox_runtime::inbox::InboundMessage {
    let (id, aggregate) = (Uuid::now_v7().to_string(), event.order_id.to_string());
    let headers = [
        ("outbox-event-id", id.as_str()),
        ("outbox-event-type", "order.placed"),
        ("outbox-aggregate-type", "order"),
        ("outbox-aggregate-id", aggregate.as_str()),
        ("outbox-event-version", "1"),
    ];
    let payload = serde_json::to_vec(event).unwrap();
    outbox_runtime::inbox::InboundMessage::from_headers(headers, &payload).unwrap()
}

#[sqlx::test(migrations = false)]
async fn the_app_role_runs_an_inbox_with_the_documented_grants(pool: PgPool) {
    use outbox_runtime::inbox::{Inbox, InboxContext, Received};

    let roles = setup(&pool, Migrator::Superuser).await;
    let app = roles.pool_as(&pool, &roles.app).await;
    let inbox = Inbox::builder(app.clone(), "billing")
        .max_attempts(1)
        .handler(|mut ctx: InboxContext, event: OrderPlaced| async move {
            if event.total_cents < 0 {
                return Err(HandlerError("refused".into()).into());
            }
            // Handlers emit follow-up events with the app's grants.
            emit(ctx.tx(), &OrderCancelled { order_id: event.order_id, reason: "x".into() })
                .await?;
            Ok::<_, outbox_runtime::BoxError>(())
        })
        .build()
        .unwrap();
    let handled = inbound(&placed(1));
    assert_eq!(inbox.receive(&handled).await.unwrap(), Received::Handled);
    assert_eq!(inbox.receive(&handled).await.unwrap(), Received::Duplicate);
    assert_eq!(inbox.receive(&inbound(&placed(-1))).await.unwrap(), Received::Dead);
    assert_eq!(inbox.purge_handled(Duration::ZERO, 100).await.unwrap(), 1);
    app.close().await;
}

#[sqlx::test(migrations = false)]
async fn the_app_role_emits_from_sql_with_the_documented_grants(pool: PgPool) {
    let roles = Roles::create(&pool).await;
    migrated(&pool).await;
    // As in a database that revoked PUBLIC's EXECUTE on functions: only the script's grants
    // let a role call these.
    let revoke = "REVOKE EXECUTE ON FUNCTION outbox.emit, outbox.uuid_v7() FROM PUBLIC";
    execute(&pool, revoke).await.unwrap();
    sqlx::raw_sql(ORDERS).execute(&pool).await.unwrap();
    roles.run_step(&pool, "objects").await;
    // The business table is the application's own.
    let grant = format!("GRANT INSERT, UPDATE, SELECT ON orders TO \"{}\"", roles.app);
    execute(&pool, sqlx::static_sql(grant)).await.unwrap();

    let app = roles.pool_as(&pool, &roles.app).await;
    let plain: Uuid = sqlx::query_scalar(
        "INSERT INTO outbox.events (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ('order', '9', 'order.placed', '{}', '{}') RETURNING event_id",
    )
    .fetch_one(&app)
    .await
    .expect("the reference insert, its id made by the default");
    let keyed = "SELECT outbox.emit('order', '1', 'order.status_changed', '{}', ordered => true, \
                                    idempotency_key => 'k')";
    let first: Uuid =
        sqlx::query_scalar(keyed).fetch_one(&app).await.expect("an ordered, keyed emit");
    let again: Uuid = sqlx::query_scalar(keyed).fetch_one(&app).await.expect("its key again");
    assert_eq!(again, first);
    execute(&app, "INSERT INTO orders VALUES (1, 'placed', 4200)")
        .await
        .expect("the trigger emits as the app role");

    let rows: Vec<(Uuid, String, bool)> =
        sqlx::query_as("SELECT event_id, event_type, ordered FROM outbox.events ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(
        rows[..2],
        [(plain, "order.placed".into(), false), (first, "order.status_changed".into(), true)]
    );
    assert_eq!((rows[2].1.as_str(), rows[2].2), ("order.status_changed", true));

    // The relay role cannot.
    let relay_pool = roles.pool_as(&pool, &roles.relay).await;
    let sql = "SELECT outbox.emit('order', '1', 'order.placed', '{}')";
    assert_denied(sql, execute(&relay_pool, sql).await);
    assert_eq!(count_rows(&pool).await, 3);
    app.close().await;
    relay_pool.close().await;
}

#[sqlx::test(migrations = false)]
async fn the_app_role_cannot_read_payloads_or_change_events(pool: PgPool) {
    let roles = setup(&pool, Migrator::Superuser).await;
    let app = roles.pool_as(&pool, &roles.app).await;
    let mut tx = app.begin().await.unwrap();
    let id =
        emit_idempotent(&mut tx, &placed(1), "k", EmitOptions::new()).await.unwrap().event_id();
    tx.commit().await.unwrap();

    for sql in [
        "UPDATE outbox.events SET published_at = now()",
        "UPDATE outbox.events SET attempts = 0, dead_at = NULL",
        "UPDATE outbox.events SET payload = '{}'",
        "DELETE FROM outbox.events",
        "TRUNCATE outbox.events",
        "SELECT payload FROM outbox.events",
        "SELECT headers FROM outbox.events",
        "SELECT aggregate_id FROM outbox.events",
        "SELECT last_error FROM outbox.events",
        "SELECT * FROM outbox.events",
        "SELECT count(*) FROM outbox.events WHERE payload IS NOT NULL",
        // Rows cannot be born published, dead, leased or with attempts spent.
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload, \
                                    published_at) \
         VALUES (gen_random_uuid(), 'order', '1', 'order.placed', '{}', now())",
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload, \
                                    dead_at) \
         VALUES (gen_random_uuid(), 'order', '1', 'order.placed', '{}', now())",
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload, \
                                    lease_token, attempts) \
         VALUES (gen_random_uuid(), 'order', '1', 'order.placed', '{}', gen_random_uuid(), 9)",
        "SELECT * FROM outbox._sqlx_migrations",
        "CREATE TABLE outbox.mine (id int)",
        "DROP TABLE outbox.events",
        "ALTER TABLE outbox.events DISABLE TRIGGER events_notify_relays",
        "SELECT nextval('outbox.events_seq_seq')",
        // The sleepers registry is the relays': the app only reads what its trigger needs.
        "INSERT INTO outbox.sleeping_relays (relay_id, until) VALUES (gen_random_uuid(), now())",
        "DELETE FROM outbox.sleeping_relays",
        "UPDATE outbox.sleeping_relays SET until = now()",
        "SELECT relay_id FROM outbox.sleeping_relays",
        "SELECT setval('outbox.relays_asleep', 0)",
        // So are the relays' heartbeats.
        "SELECT relay_id FROM outbox.relays",
        "DELETE FROM outbox.relays",
        "SELECT minute FROM outbox.activity",
        "DELETE FROM outbox.activity",
    ] {
        assert_denied(sql, execute(&app, sql).await);
    }

    // The operations are the relay's business.
    assert_op_denied("stats", outbox_runtime::stats(&app).await);
    assert_op_denied("stats_by_type", outbox_runtime::stats_by_type(&app).await);
    assert_op_denied("purge", outbox_runtime::purge_published(&app, Duration::ZERO).await);
    let all = DeadFilter::all();
    assert_op_denied("list dead", dead_letters::list(&app, &all, None, 10).await);
    assert_op_denied("get dead", dead_letters::get(&app, id).await);
    assert_op_denied("requeue", dead_letters::requeue(&app, &all).await);
    assert_op_denied("discard", dead_letters::discard(&app, &all).await);
    assert_op_denied("relays", outbox_runtime::relays::relays(&app).await);
    assert_op_denied("event", outbox_runtime::events::get(&app, id).await);
    assert_op_denied("pause", pauses::pause(&app, "order", "order.placed", None).await);
    assert_op_denied("resume", pauses::resume(&app, "order", "order.placed").await);
    let (from, until) = (chrono::Utc::now() - chrono::Duration::hours(1), chrono::Utc::now());
    assert_op_denied("replay", replay::replay(&app, "order", "order.placed", from, until).await);

    // What it can read: exactly the three columns emit needs.
    let (seen, aggregate_type, key): (Uuid, String, Option<String>) =
        sqlx::query_as("SELECT event_id, aggregate_type, idempotency_key FROM outbox.events")
            .fetch_one(&app)
            .await
            .unwrap();
    assert_eq!((seen, aggregate_type.as_str(), key.as_deref()), (id, "order", Some("k")));

    let state = row_state(&pool, id).await;
    assert_eq!((state.published, state.attempts, state.dead), (false, 0, false), "untouched");
    assert_eq!(count_rows(&pool).await, 1, "nothing written by the refused statements");
    app.close().await;
}

// ---------------------------------------------------------------------------------------------
// The relay role
// ---------------------------------------------------------------------------------------------

/// The relay's handlers' state: what they delivered, and whether the downstream is broken.
#[derive(Clone, Default)]
struct Desk {
    delivered: Arc<Mutex<Vec<Uuid>>>,
    broken: Arc<AtomicBool>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Downstream(&'static str);

/// `total_cents` 1 succeeds; 2 fails its first attempt; 3 fails while the desk is broken.
async fn on_placed(ctx: EventContext<Desk>, event: OrderPlaced) -> Result<(), Downstream> {
    match event.total_cents {
        2 if ctx.delivery() == 1 => return Err(Downstream("flaky")),
        3 if ctx.state().broken.load(Ordering::SeqCst) => return Err(Downstream("broken")),
        _ => {}
    }
    ctx.state().delivered.lock().unwrap().push(ctx.event_id());
    Ok(())
}

/// Publishes in its own transaction, on the relay role's pool.
async fn on_cancelled(ctx: TransactionContext<Desk>, _: OrderCancelled) -> Result<(), Downstream> {
    ctx.state().delivered.lock().unwrap().push(ctx.event_id());
    Ok(())
}

/// A hand-written row, as the superuser.
async fn insert_row(pool: &PgPool, columns: &str, values: &str) -> Uuid {
    let sql = format!(
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload, \
                                    {columns}) \
         VALUES (gen_random_uuid(), 'order', '1', 'order.placed', \
                 jsonb_build_object('order_id', gen_random_uuid(), 'total_cents', 1), {values}) \
         RETURNING event_id"
    );
    sqlx::query_scalar(sqlx::static_sql(sql)).fetch_one(pool).await.unwrap()
}

#[sqlx::test(migrations = false)]
async fn the_relay_role_runs_the_relay_and_the_operations(pool: PgPool) {
    let roles = setup(&pool, Migrator::Superuser).await;
    let app = roles.pool_as(&pool, &roles.app).await;
    let relay_pool = roles.pool_as(&pool, &roles.relay).await;

    let mut tx = app.begin().await.unwrap();
    let [ok, flaky, doomed]: [Uuid; 3] =
        emit_all(&mut tx, &[placed(1), placed(2), placed(3)]).await.unwrap().try_into().unwrap();
    let cancel = OrderCancelled { order_id: Uuid::now_v7(), reason: "r".into() };
    let cancelled = emit(&mut tx, &cancel).await.unwrap();
    tx.commit().await.unwrap();
    // For retention (an event published 30 days ago) and for discard (a dead event).
    let old = insert_row(&pool, "published_at", "now() - interval '30 days'").await;
    let dead = insert_row(&pool, "attempts, dead_at", "5, now()").await;

    let desk = Desk::default();
    desk.broken.store(true, Ordering::SeqCst);
    let relay = Running::start(
        fast(Relay::builder(relay_pool.clone()))
            .state(desk.clone())
            .handler(on_placed)
            .handler(on_cancelled)
            .max_attempts(2)
            .retention(Duration::from_secs(7 * 24 * 3600)),
    );
    let published = |id| {
        let pool = pool.clone();
        async move { row_state(&pool, id).await.published }
    };
    eventually("ok is delivered", || published(ok)).await;
    eventually("flaky is delivered after a retry", || published(flaky)).await;
    eventually("the transactional handler published", || published(cancelled)).await;
    eventually("doomed is dead", || async { row_state(&pool, doomed).await.dead }).await;
    let retained = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox.events WHERE event_id = $1")
            .bind(old)
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    eventually("the relay's retention purged the old event", || async { retained().await == 0 })
        .await;
    assert_eq!(row_state(&pool, flaky).await.attempts, 1);
    let doomed_row = row_state(&pool, doomed).await;
    assert_eq!((doomed_row.attempts, doomed_row.last_error.as_deref()), (2, Some("broken")));

    // The relay's own connections (lease, acknowledge, renew, LISTEN) are the relay role's.
    let relay_sessions: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT usename::text, application_name, query FROM pg_stat_activity \
         WHERE datname = current_database() AND application_name LIKE 'outbox-relay%'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(relay_sessions.iter().all(|(user, ..)| *user == roles.relay), "{relay_sessions:?}");
    assert!(
        relay_sessions.iter().any(|(_, name, query)| name == "outbox-relay-listen"
            && query.to_uppercase().starts_with("LISTEN")),
        "the relay role LISTENs: {relay_sessions:?}"
    );

    // Dead letters, under the relay role.
    let listed = dead_letters::list(&relay_pool, &DeadFilter::all(), None, 10).await.unwrap();
    let mut listed: Vec<Uuid> = listed.into_iter().map(|e| e.event_id).collect();
    let mut expected = vec![doomed, dead];
    listed.sort();
    expected.sort();
    assert_eq!(listed, expected);
    let shown = dead_letters::get(&relay_pool, doomed).await.unwrap().expect("doomed is dead");
    assert_eq!(shown.last_error.as_deref(), Some("broken"));
    desk.broken.store(false, Ordering::SeqCst);
    assert_eq!(dead_letters::requeue(&relay_pool, &DeadFilter::event(doomed)).await.unwrap(), 1);
    eventually("the requeued event is delivered", || published(doomed)).await;
    assert_eq!(dead_letters::discard(&relay_pool, &DeadFilter::event(dead)).await.unwrap(), 1);

    let stats = outbox_runtime::stats(&relay_pool).await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 0));
    assert!(outbox_runtime::stats_by_type(&relay_pool).await.unwrap().is_empty());
    // The gauges' shared reading: the relay role counts and stores it.
    let reading =
        outbox_runtime::__private::test_hooks::shared_stats_by_type(&relay_pool, Duration::ZERO);
    assert_eq!(reading.await.unwrap(), Some(vec![]));
    // Its heartbeat, and the list `outbox status` reads, under the relay role.
    eventually("the relay's entry counts its deliveries", || async {
        let entries = outbox_runtime::relays::relays(&relay_pool).await.unwrap();
        entries.len() == 1 && entries[0].delivered == 4
    })
    .await;
    // And its activity: the minutes' deliveries and readings, under the relay role.
    eventually("the relay records its deliveries by the minute", || async {
        let delivered: Option<i64> =
            sqlx::query_scalar("SELECT sum(delivered)::int8 FROM outbox.activity WHERE read")
                .fetch_one(&relay_pool)
                .await
                .unwrap();
        delivered == Some(4)
    })
    .await;
    // Pausing and resuming a type, under the relay role.
    assert!(pauses::pause(&relay_pool, "order", "order.placed", Some("r")).await.unwrap());
    assert_eq!(pauses::paused(&relay_pool).await.unwrap().len(), 1);
    assert!(pauses::resume(&relay_pool, "order", "order.placed").await.unwrap());
    let counts = relay.stop().await;
    assert_eq!((counts.delivered, counts.failed, counts.dead), (4, 3, 1));
    assert!(outbox_runtime::relays::relays(&relay_pool).await.unwrap().is_empty(), "withdrawn");
    let delivered = desk.delivered.lock().unwrap().clone();
    assert_eq!(delivered.len(), 4);
    for id in [ok, flaky, cancelled, doomed] {
        assert!(delivered.contains(&id), "{id} was handled");
    }

    // Replay, under the relay role: the three placed events, pending again, then published.
    let (from, until) = (chrono::Utc::now() - chrono::Duration::hours(1), chrono::Utc::now());
    assert_eq!(replay::count(&relay_pool, "order", "order.placed", from, until).await.unwrap(), 3);
    assert_eq!(replay::replay(&relay_pool, "order", "order.placed", from, until).await.unwrap(), 3);
    sqlx::query("UPDATE outbox.events SET published_at = now() WHERE published_at IS NULL")
        .execute(&pool)
        .await
        .unwrap();

    // Retention as a library call, under the relay role: the four delivered events.
    assert_eq!(outbox_runtime::purge_published(&relay_pool, Duration::ZERO).await.unwrap(), 4);
    assert_eq!(count_rows(&pool).await, 0);
    app.close().await;
    relay_pool.close().await;
}

#[sqlx::test(migrations = false)]
async fn the_relay_role_cannot_write_or_rewrite_events(pool: PgPool) {
    let roles = setup(&pool, Migrator::Superuser).await;
    let relay_pool = roles.pool_as(&pool, &roles.relay).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];

    // emit under the relay role is refused by the database, and writes nothing.
    let mut tx = relay_pool.begin().await.unwrap();
    let refused = emit(&mut tx, &placed(2)).await;
    tx.rollback().await.unwrap();
    assert_op_denied("emit", refused);

    for sql in [
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES (gen_random_uuid(), 'order', '1', 'order.placed', '{}')",
        "UPDATE outbox.events SET payload = '{}'",
        "UPDATE outbox.events SET headers = '{}'",
        "UPDATE outbox.events SET event_type = 'order.cancelled'",
        "UPDATE outbox.events SET aggregate_type = 'x', aggregate_id = 'y'",
        "UPDATE outbox.events SET event_id = gen_random_uuid()",
        "UPDATE outbox.events SET created_at = now(), ordered = true",
        "UPDATE outbox.events SET idempotency_key = 'k'",
        "TRUNCATE outbox.events",
        "SELECT * FROM outbox._sqlx_migrations",
        "SELECT checksum FROM outbox._sqlx_migrations",
        "UPDATE outbox._sqlx_migrations SET success = false",
        "DELETE FROM outbox._sqlx_migrations",
        "CREATE TABLE outbox.mine (id int)",
        "DROP TABLE outbox.events",
        "ALTER TABLE outbox.events DISABLE TRIGGER events_notify_relays",
    ] {
        assert_denied(sql, execute(&relay_pool, sql).await);
    }

    // Its bookkeeping columns it can update, and the row is otherwise as emitted.
    let bookkeeping = "UPDATE outbox.events SET attempts = attempts, last_error = last_error, \
                       available_at = available_at, lease_token = lease_token, \
                       dead_at = dead_at, published_at = published_at";
    assert_eq!(execute(&relay_pool, bookkeeping).await.unwrap(), 1);
    assert_eq!(count_rows(&pool).await, 1);
    let (event_type, payload): (String, serde_json::Value) =
        sqlx::query_as("SELECT event_type, payload FROM outbox.events WHERE event_id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(event_type, "order.placed");
    assert_eq!(payload["total_cents"], 1);
    relay_pool.close().await;
}

#[sqlx::test(migrations = false)]
async fn a_relay_role_without_the_history_grant_is_told_which_grant(pool: PgPool) {
    let roles = setup(&pool, Migrator::Superuser).await;
    let revoke =
        format!("REVOKE SELECT (version, success) ON outbox._sqlx_migrations FROM {}", roles.relay);
    sqlx::query(sqlx::static_sql(revoke)).execute(&pool).await.unwrap();
    let relay_pool = roles.pool_as(&pool, &roles.relay).await;

    let relay = Relay::builder(relay_pool.clone()).state(Desk::default()).handler(on_placed);
    let err = relay.build().unwrap().run_until(std::future::pending()).await.unwrap_err();
    let Error::MigrationsUnreadable { role, table, .. } = &err else {
        panic!("expected MigrationsUnreadable, got {err:?}");
    };
    assert_eq!((role.as_str(), *table), (roles.relay.as_str(), "outbox._sqlx_migrations"));
    let grant =
        format!("GRANT SELECT (version, success) ON outbox._sqlx_migrations TO {}", roles.relay);
    assert!(err.to_string().contains(&grant), "{err}");
    relay_pool.close().await;
}

#[sqlx::test(migrations = false)]
async fn notify_from_the_app_role_wakes_a_relay_role_listener(pool: PgPool) {
    let roles = setup(&pool, Migrator::Superuser).await;
    let app = roles.pool_as(&pool, &roles.app).await;
    let relay_pool = roles.pool_as(&pool, &roles.relay).await;

    let desk = Desk::default();
    // Polling hourly: only the insert trigger's NOTIFY can bring the event in time.
    let relay = Running::start(
        Relay::builder(relay_pool.clone())
            .state(desk.clone())
            .handler(on_placed)
            .poll_interval(Duration::from_secs(3600)),
    );
    let listening = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND usename = $1 AND query ILIKE 'LISTEN%'",
        )
        .bind(&roles.relay)
        .fetch_one(&pool)
        .await
        .unwrap()
            == 1
    };
    eventually("the relay role LISTENs", listening).await;
    // The relay registered itself as asleep (under the relay role), so the insert trigger
    // (running as the app role) sees it and notifies.
    let asleep = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM outbox.sleeping_relays WHERE until > now() + interval '1 hour'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
            == 1
    };
    eventually("the relay sleeps", asleep).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // past the wake-up after subscribing

    let mut tx = app.begin().await.unwrap();
    let id = emit(&mut tx, &placed(1)).await.unwrap();
    tx.commit().await.unwrap();
    eventually("the event is delivered", || async { desk.delivered.lock().unwrap().len() == 1 })
        .await;
    relay.stop().await;
    assert_eq!(*desk.delivered.lock().unwrap(), [id]);
    app.close().await;
    relay_pool.close().await;
}

#[sqlx::test(migrations = false)]
async fn a_relay_role_sees_an_app_transaction_open_since_before_it_slept_end(pool: PgPool) {
    let roles = setup(&pool, Migrator::Superuser).await;
    let app = roles.pool_as(&pool, &roles.app).await;
    let relay_pool = roles.pool_as(&pool, &roles.relay).await;

    // Emitted before any relay sleeps: the commit notifies nobody. Polling hourly, the relay
    // (under the relay role) delivers in time only if it read in `pg_locks` that this
    // transaction was writing to `outbox.events` when it registered, and then saw it end.
    let mut tx = app.begin().await.unwrap();
    let id = emit(&mut tx, &placed(1)).await.unwrap();
    let desk = Desk::default();
    let relay = Running::start(
        Relay::builder(relay_pool.clone())
            .state(desk.clone())
            .handler(on_placed)
            .poll_interval(Duration::from_secs(3600)),
    );
    let asleep = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM outbox.sleeping_relays WHERE until > now() + interval '1 hour'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
            == 1
    };
    eventually("the relay sleeps", asleep).await;
    tx.commit().await.unwrap();
    eventually("the event is delivered", || async { desk.delivered.lock().unwrap().len() == 1 })
        .await;
    relay.stop().await;
    assert_eq!(*desk.delivered.lock().unwrap(), [id]);
    app.close().await;
    relay_pool.close().await;
}

// ---------------------------------------------------------------------------------------------
// The owner role
// ---------------------------------------------------------------------------------------------

#[sqlx::test(migrations = false)]
async fn the_owner_role_migrates_and_grants_without_superuser(pool: PgPool) {
    let roles = setup(&pool, Migrator::Owner).await;
    let (schema_owner, table_owner, history_owner): (String, String, String) = sqlx::query_as(
        "SELECT (SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'outbox'), \
                (SELECT tableowner::text FROM pg_tables \
                 WHERE schemaname = 'outbox' AND tablename = 'events'), \
                (SELECT tableowner::text FROM pg_tables \
                 WHERE schemaname = 'outbox' AND tablename = '_sqlx_migrations')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((schema_owner.as_str(), table_owner.as_str()), (&*roles.owner, &*roles.owner));
    assert_eq!(history_owner, roles.owner);

    // The grants the owner issued work: the app emits, the relay delivers.
    let app = roles.pool_as(&pool, &roles.app).await;
    let relay_pool = roles.pool_as(&pool, &roles.relay).await;
    let mut tx = app.begin().await.unwrap();
    let id =
        emit_idempotent(&mut tx, &placed(1), "k", EmitOptions::new()).await.unwrap().event_id();
    tx.commit().await.unwrap();
    let desk = Desk::default();
    deliver(
        &pool,
        fast(Relay::builder(relay_pool.clone())).state(desk.clone()).handler(on_placed),
        id,
    )
    .await;
    assert_eq!(*desk.delivered.lock().unwrap(), [id]);

    // The roles' privileges are the script's, and no more: nobody but the owner may create in
    // the schema, and of the migration history the relay reads two columns only.
    let privileges: Vec<(String, bool, bool)> = sqlx::query_as(
        "SELECT r, has_schema_privilege(r, 'outbox', 'CREATE'), \
                has_table_privilege(r, 'outbox._sqlx_migrations', 'SELECT,INSERT,UPDATE,DELETE') \
         FROM unnest($1::text[]) AS r",
    )
    .bind([&roles.app, &roles.relay])
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(privileges.iter().all(|(_, create, history)| !create && !history), "{privileges:?}");
    app.close().await;
    relay_pool.close().await;
}

/// Fails each event's first delivery.
async fn flaky_subscriber(ctx: EventContext<Desk>, _: OrderPlaced) -> Result<(), Downstream> {
    if ctx.delivery() == 1 {
        return Err(Downstream("flaky"));
    }
    ctx.state().delivered.lock().unwrap().push(ctx.event_id());
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn the_relay_role_runs_subscribers_and_their_operations(pool: PgPool) {
    let roles = setup(&pool, Migrator::Superuser).await;
    let app = roles.pool_as(&pool, &roles.app).await;
    let relay_pool = roles.pool_as(&pool, &roles.relay).await;
    let mut tx = app.begin().await.unwrap();
    let ids = emit_all(&mut tx, &[placed(1), placed(1)]).await.unwrap();
    tx.commit().await.unwrap();

    // Registering, delivering at once, and copying for the subscriber that failed.
    let desk = Desk::default();
    let relay = Running::start(
        fast(Relay::builder(relay_pool.clone()))
            .state(desk.clone())
            .subscriber("desk", on_placed)
            .subscriber("flaky", flaky_subscriber),
    );
    eventually("both subscribers took both events", || async {
        desk.delivered.lock().unwrap().len() == 4
    })
    .await;
    eventually("nothing is pending", || async {
        outbox_runtime::stats(&relay_pool).await.unwrap().pending == 0
    })
    .await;
    let counts = relay.stop().await;
    assert_eq!((counts.delivered, counts.failed), (4, 2));
    let listed = outbox_runtime::subscribers::list(&relay_pool).await.unwrap();
    let names: Vec<&str> = listed.iter().map(|s| s.subscriber.as_str()).collect();
    assert_eq!(names, ["desk", "flaky"]);

    // A replay to one subscriber, then its removal, under the relay role.
    let (from, until) = (chrono::Utc::now() - chrono::Duration::hours(1), chrono::Utc::now());
    let replayed = replay::replay_to(&relay_pool, "flaky", "order", "order.placed", from, until);
    assert_eq!(replayed.await.unwrap(), 2);
    let removed = outbox_runtime::subscribers::remove(&relay_pool, "flaky").await.unwrap();
    assert_eq!((removed.registrations, removed.pending, removed.dead), (1, 2, 0));
    assert_eq!(outbox_runtime::stats(&relay_pool).await.unwrap().pending, 0);
    let delivered = desk.delivered.lock().unwrap().clone();
    assert!(ids.iter().all(|id| delivered.iter().filter(|d| *d == id).count() == 2));
    app.close().await;
    relay_pool.close().await;
}
