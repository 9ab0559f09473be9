//! Transactional handlers against the real PostgreSQL: a handler that takes a
//! `TransactionContext` writes (and emits follow-up events) in the transaction that acknowledges
//! the delivery, so its effects exist exactly when the delivery counted. A failing attempt, a
//! relay killed inside the handler, or a lease stolen before the commit leaves none of them, and
//! the attempt that succeeds writes once.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::{BoxError, Relay, TransactionContext};
use sqlx::PgPool;
use support::accounts::*;
use support::*;
use tokio::sync::Notify;
use uuid::Uuid;

async fn create_projection(pool: &PgPool) {
    sqlx::query("CREATE TABLE projection (event_id uuid NOT NULL, attempt int4 NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

/// The committed projection rows: `(event_id, attempt)`.
async fn projection(pool: &PgPool) -> Vec<(Uuid, i32)> {
    sqlx::query_as("SELECT event_id, attempt FROM projection ORDER BY attempt")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Writes the delivery into the projection, in the handler's transaction.
async fn project<S>(ctx: &mut TransactionContext<S>) -> Result<(), sqlx::Error> {
    let (event_id, attempt) = (ctx.event_id(), i32::try_from(ctx.delivery()).unwrap());
    sqlx::query("INSERT INTO projection (event_id, attempt) VALUES ($1, $2)")
        .bind(event_id)
        .bind(attempt)
        .execute(&mut **ctx.tx())
        .await?;
    Ok(())
}

/// State of the transactional handlers that stall.
#[derive(Clone, Default)]
struct Stall {
    log: Log,
    started: Arc<Notify>,
    finish: Arc<Notify>,
}

#[sqlx::test(migrations = false)]
async fn a_transactional_handler_commits_its_writes_with_the_acknowledgement(pool: PgPool) {
    migrated(&pool).await;
    create_projection(&pool).await;
    let id = emit_committed(&pool, &[noted(1, 1)]).await[0];

    async fn projects(mut ctx: TransactionContext<Log>, event: Noted) -> Result<(), BoxError> {
        ctx.state().record(&ctx, event.account, event.n);
        project(&mut ctx).await?;
        Ok(())
    }
    let log = Log::default();
    let counts =
        deliver(&pool, fast(Relay::builder(pool.clone())).state(log.clone()).handler(projects), id)
            .await;

    assert_eq!(projection(&pool).await, [(id, 1)]);
    assert_eq!(log.len(), 1, "the handler ran once");
    let row = row_state(&pool, id).await;
    assert_eq!((row.published, row.attempts), (true, 0));
    assert_eq!((counts.delivered, counts.failed, counts.lost_leases), (1, 0, 0));
}

#[sqlx::test(migrations = false)]
async fn a_failing_transactional_handler_leaves_no_writes(pool: PgPool) {
    migrated(&pool).await;
    create_projection(&pool).await;
    let id = emit_committed(&pool, &[noted(1, 1)]).await[0];

    async fn writes_then_fails_once(
        mut ctx: TransactionContext<Log>,
        event: Noted,
    ) -> Result<(), BoxError> {
        ctx.state().record(&ctx, event.account, event.n);
        project(&mut ctx).await?;
        if ctx.delivery() == 1 {
            return Err("the read model rejected it after writing".into());
        }
        Ok(())
    }
    let log = Log::default();
    let counts = deliver(
        &pool,
        fast(Relay::builder(pool.clone())).state(log.clone()).handler(writes_then_fails_once),
        id,
    )
    .await;

    assert_eq!(projection(&pool).await, [(id, 2)], "only the second attempt's write stands");
    assert_eq!(log.of(1), [(1, 1), (1, 2)]);
    let row = row_state(&pool, id).await;
    assert_eq!(row.attempts, 1);
    assert_eq!(row.last_error.as_deref(), Some("the read model rejected it after writing"));
    assert_eq!((counts.delivered, counts.failed), (1, 1));
}

#[sqlx::test(migrations = false)]
async fn a_relay_killed_inside_a_transactional_handler_leaves_no_writes(pool: PgPool) {
    migrated(&pool).await;
    create_projection(&pool).await;
    let id = emit_committed(&pool, &[noted(1, 1)]).await[0];

    // The first attempt writes, then hangs until the relay dies.
    async fn writes_then_hangs_once(
        mut ctx: TransactionContext<Stall>,
        event: Noted,
    ) -> Result<(), BoxError> {
        ctx.state().log.record(&ctx, event.account, event.n);
        project(&mut ctx).await?;
        if ctx.delivery() == 1 {
            ctx.state().started.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(())
    }
    let stall = Stall::default();
    let doomed = Relay::builder(pool.clone())
        .state(stall.clone())
        .handler(writes_then_hangs_once)
        .lease_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let doomed = tokio::spawn(doomed.run_until(std::future::pending()));
    signalled(&stall.started, "the handler wrote and hangs").await;
    assert_eq!(projection(&pool).await, [], "the write is not committed yet");

    doomed.abort(); // the relay dies inside the handler
    let _ = doomed.await;
    assert_eq!(projection(&pool).await, []);
    let row = row_state(&pool, id).await;
    assert!(!row.published && row.leased, "the event is neither published nor handed back");
    eventually("the dead relay's transaction is rolled back", || async {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        open == 0
    })
    .await;

    // Once the lease expires, another relay delivers it, and the projection is written once.
    let heir_stall = Stall::default();
    let heir = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(heir_stall.clone())
            .handler(writes_then_hangs_once),
    );
    eventually("the heir publishes the event", || async { row_state(&pool, id).await.published })
        .await;
    let counts = heir.stop().await;

    assert_eq!(projection(&pool).await, [(id, 2)], "written exactly once, by the second attempt");
    assert_eq!(stall.log.of(1), [(1, 1)]);
    assert_eq!(heir_stall.log.of(1), [(1, 2)], "the expired lease counts as an attempt");
    assert_eq!(counts.delivered, 1);
}

#[sqlx::test(migrations = false)]
async fn a_transactional_handler_cannot_commit_under_a_stolen_lease(pool: PgPool) {
    migrated(&pool).await;
    create_projection(&pool).await;
    let id = emit_committed(&pool, &[noted(1, 1)]).await[0];

    async fn writes_then_waits(
        mut ctx: TransactionContext<Stall>,
        event: Noted,
    ) -> Result<(), BoxError> {
        let stall = ctx.state().clone();
        stall.log.record(&ctx, event.account, event.n);
        project(&mut ctx).await?;
        stall.started.notify_one();
        stall.finish.notified().await;
        Ok(())
    }
    // A 30 s lease is renewed every 10 s: the renewer does not notice the theft in this test.
    let stall = Stall::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(stall.clone())
            .handler(writes_then_waits)
            .lease_timeout(Duration::from_secs(30)),
    );
    signalled(&stall.started, "the handler wrote").await;
    let stolen: Uuid = sqlx::query_scalar(
        "UPDATE outbox.events SET lease_token = gen_random_uuid() WHERE event_id = $1 \
         RETURNING lease_token",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    stall.finish.notify_one();
    eventually("the relay counts the lost lease", || async {
        relay.metrics.counts().lost_leases == 1
    })
    .await;

    assert_eq!(projection(&pool).await, [], "the handler's write is rolled back");
    assert!(!row_state(&pool, id).await.published);
    assert_eq!(lease_token(&pool, id).await, Some(stolen), "the new lease holder keeps the row");
    let counts = relay.stop().await;
    assert_eq!((counts.delivered, counts.failed, counts.lost_leases), (0, 0, 1));
    assert_eq!(stall.log.len(), 1);
}

#[sqlx::test(migrations = false)]
async fn a_follow_up_event_exists_iff_the_delivery_committed(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[noted(1, 1)]).await[0];

    type FollowUps = Arc<Mutex<Vec<(u32, Uuid)>>>;
    async fn emits_follow_up(
        mut ctx: TransactionContext<FollowUps>,
        event: Noted,
    ) -> Result<(), BoxError> {
        let attempt = ctx.delivery();
        let follow_up = Audited { account: event.account, n: attempt };
        let follow_id = outbox_runtime::emit(ctx.tx(), &follow_up).await?;
        ctx.state().lock().unwrap().push((attempt, follow_id));
        if attempt == 1 {
            return Err("failed after emitting".into());
        }
        Ok(())
    }
    let follow_ups = FollowUps::default();
    let counts = deliver(
        &pool,
        fast(Relay::builder(pool.clone())).state(follow_ups.clone()).handler(emits_follow_up),
        id,
    )
    .await;

    let emitted = follow_ups.lock().unwrap().clone();
    assert_eq!(emitted.len(), 2);
    let stored: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT event_id, (payload->>'n')::int8 FROM outbox.events WHERE aggregate_type = 'audit'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(stored, [(emitted[1].1, 2)], "only the committed delivery's follow-up exists");
    assert_eq!((counts.delivered, counts.failed), (1, 1));
}

/// Writes the delivery into the projection; the projection's deferred trigger decides at commit.
async fn projects(mut ctx: TransactionContext<Log>, event: Noted) -> Result<(), BoxError> {
    ctx.state().record(&ctx, event.account, event.n);
    project(&mut ctx).await?;
    Ok(())
}

/// A trigger on the projection that runs `body` at commit of the first transaction that writes
/// it (a sequence counts them, outside any transaction).
async fn at_first_commit(pool: &PgPool, body: &str) {
    let statements = [
        "CREATE SEQUENCE commits".to_owned(),
        format!(
            "CREATE FUNCTION at_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 IF nextval('commits') = 1 THEN {body}; END IF; RETURN NULL; END $$"
        ),
        "CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON projection \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION at_commit()"
            .to_owned(),
    ];
    for statement in statements {
        sqlx::raw_sql(sqlx::static_sql(statement)).execute(pool).await.unwrap();
    }
}

#[sqlx::test(migrations = false)]
async fn an_exhausted_pool_at_begin_costs_a_transactional_handler_no_attempt(pool: PgPool) {
    migrated(&pool).await;
    create_projection(&pool).await;
    let id = emit_committed(&pool, &[noted(1, 1)]).await[0];
    // The application's pool, one connection, taken by the test: `begin` times out.
    let app = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(100))
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let taken = app.acquire().await.unwrap();
    let log = Log::default();
    // One attempt: a single failure counted would kill the event.
    let relay = Running::start(
        fast(Relay::builder(app.clone())).state(log.clone()).handler(projects).max_attempts(1),
    );
    eventually("the relay handed the row back a few times", || async {
        relay.metrics.counts().handed_back >= 3
    })
    .await;
    let row = row_state(&pool, id).await;
    assert_eq!((row.dead, row.attempts, row.last_error), (false, 0, None), "no attempt counted");
    assert_eq!(log.len(), 0, "the handler never ran without its transaction");

    drop(taken);
    until_published(&pool, id).await;
    let counts = relay.stop().await;
    assert_eq!(projection(&pool).await, [(id, 1)], "written once, on the first attempt");
    assert_eq!((counts.delivered, counts.failed, counts.dead), (1, 0, 0));
    assert_eq!(row_state(&pool, id).await.attempts, 0);
    // Before the test's database is dropped.
    app.close().await;
}

#[sqlx::test(migrations = false)]
async fn a_connection_lost_at_commit_costs_a_transactional_handler_no_attempt(pool: PgPool) {
    migrated(&pool).await;
    create_projection(&pool).await;
    // The first commit's backend is terminated in the middle of committing.
    at_first_commit(&pool, "PERFORM pg_terminate_backend(pg_backend_pid())").await;
    let id = emit_committed(&pool, &[noted(1, 1)]).await[0];
    let log = Log::default();
    let counts = deliver(
        &pool,
        fast(Relay::builder(pool.clone())).state(log.clone()).handler(projects).max_attempts(1),
        id,
    )
    .await;

    assert_eq!(log.len(), 2, "delivered again after the lost commit");
    assert_eq!(projection(&pool).await, [(id, 1)], "only the committed delivery's write stands");
    let row = row_state(&pool, id).await;
    assert_eq!((row.published, row.dead, row.attempts), (true, false, 0));
    assert_eq!((counts.delivered, counts.failed, counts.handed_back), (1, 0, 1));
}

#[sqlx::test(migrations = false)]
async fn a_commit_the_database_refuses_is_the_handlers_failure(pool: PgPool) {
    migrated(&pool).await;
    create_projection(&pool).await;
    // A deferred check the handler's write breaks: the commit itself is refused.
    at_first_commit(&pool, "RAISE EXCEPTION 'projection rejected at commit'").await;
    let id = emit_committed(&pool, &[noted(1, 1)]).await[0];
    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(log.clone()).handler(projects).max_attempts(1),
    );
    eventually("the event is dead", || async { row_state(&pool, id).await.dead }).await;
    let counts = relay.stop().await;

    let row = row_state(&pool, id).await;
    assert_eq!(row.attempts, 1);
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("projection rejected at commit"), "{error}");
    assert_eq!(projection(&pool).await, [], "nothing committed");
    assert_eq!((counts.delivered, counts.failed, counts.dead), (0, 1, 1));
}
