//! The inbox: a message handled once however often (and however concurrently) the broker
//! delivers it; failures counted and kept as dead letters, the handler's writes rolled back
//! with them; a database that fails costs the message nothing. Real PostgreSQL, one database
//! per test.

mod support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::inbox::{InboundMessage, Inbox, InboxContext, InboxError, Received};
use outbox_runtime::{Backoff, OutboxEvent, Reject, Snooze};
use sqlx::PgPool;
use support::*;
use uuid::Uuid;

/// The message a forwarding relay would send for `event`, as emitted with id `event_id`.
fn message_of(event_id: Uuid, event: &OrderPlaced) -> InboundMessage {
    let id = event_id.to_string();
    let aggregate_id = event.order_id.to_string();
    let headers = [
        ("outbox-event-id", id.as_str()),
        ("outbox-event-type", "order.placed"),
        ("outbox-aggregate-type", "order"),
        ("outbox-aggregate-id", aggregate_id.as_str()),
        ("outbox-event-version", "1"),
        ("outbox-created-at", "2026-12-07T10:00:00Z"),
        ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    ];
    let payload = serde_json::to_vec(event).unwrap();
    InboundMessage::from_headers(headers, &payload).unwrap()
}

/// The service's own table, which handlers write to in the inbox's transaction.
async fn setup(pool: &PgPool) {
    migrated(pool).await;
    sqlx::query("CREATE TABLE invoices (order_id uuid PRIMARY KEY, cents bigint NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

async fn invoices(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM invoices").fetch_one(pool).await.unwrap()
}

/// Writes the invoice and emits a follow-up event, both in the inbox's transaction.
async fn bill(mut ctx: InboxContext, event: OrderPlaced) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO invoices (order_id, cents) VALUES ($1, $2)")
        .bind(event.order_id)
        .bind(event.total_cents)
        .execute(&mut **ctx.tx())
        .await?;
    let follow_up = OrderCancelled { order_id: event.order_id, reason: "billed".into() };
    outbox_runtime::emit(ctx.tx(), &follow_up)
        .await
        .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
    Ok(())
}

/// `(attempts, handled, dead, last_error, payload kept)` of a message's inbox row.
async fn row(
    pool: &PgPool,
    consumer: &str,
    event_id: Uuid,
) -> (i32, bool, bool, Option<String>, bool) {
    sqlx::query_as(
        "SELECT attempts, handled_at IS NOT NULL, dead_at IS NOT NULL, last_error, payload IS NOT NULL \
         FROM outbox.inbox WHERE consumer = $1 AND event_id = $2",
    )
    .bind(consumer)
    .bind(event_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_message_is_handled_once_however_often_it_arrives(pool: PgPool) {
    setup(&pool).await;
    let inbox = Inbox::builder(pool.clone(), "billing").handler(bill).build().unwrap();
    let (id, event) = (Uuid::now_v7(), placed(1250));
    let message = message_of(id, &event);
    assert_eq!(inbox.receive(&message).await.unwrap(), Received::Handled);
    for _ in 0..3 {
        let again = inbox.receive(&message).await.unwrap();
        assert_eq!(again, Received::Duplicate);
        assert!(again.acknowledge());
    }
    assert_eq!(invoices(&pool).await, 1, "the effect happened once");
    let follow_ups: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.events").fetch_one(&pool).await.unwrap();
    assert_eq!(follow_ups, 1, "the follow-up event was emitted once");
    assert_eq!(row(&pool, "billing", id).await, (0, true, false, None, false));

    // Another consumer has its own record: it handles the message too.
    let audit = Inbox::builder(pool.clone(), "audit")
        .handler(|_: InboxContext, _: OrderPlaced| async { Ok::<_, HandlerError>(()) })
        .build()
        .unwrap();
    assert_eq!(audit.receive(&message).await.unwrap(), Received::Handled);
    assert_eq!(audit.receive(&message).await.unwrap(), Received::Duplicate);
}

#[sqlx::test(migrations = false)]
async fn concurrent_deliveries_of_one_message_handle_it_once_with_both_cores_busy(pool: PgPool) {
    setup(&pool).await;
    let calls = Arc::new(AtomicU32::new(0));
    let inbox = Inbox::builder(pool.clone(), "billing")
        .state(calls.clone())
        .handler(|mut ctx: InboxContext<Arc<AtomicU32>>, event: OrderPlaced| async move {
            ctx.state().fetch_add(1, Ordering::SeqCst);
            // Long enough that the other deliveries arrive while this one's record is open.
            tokio::time::sleep(Duration::from_millis(100)).await;
            sqlx::query("INSERT INTO invoices (order_id, cents) VALUES ($1, $2)")
                .bind(event.order_id)
                .bind(event.total_cents)
                .execute(&mut **ctx.tx())
                .await?;
            Ok::<_, sqlx::Error>(())
        })
        .build()
        .unwrap();
    let _busy = CpuBurner::start(Duration::from_secs(30));
    for round in 0..3 {
        let message = message_of(Uuid::now_v7(), &placed(round));
        let deliveries = (0..8).map(|_| {
            let (inbox, message) = (inbox.clone(), message.clone());
            tokio::spawn(async move { inbox.receive(&message).await.unwrap() })
        });
        let mut outcomes = Vec::new();
        for delivery in deliveries.collect::<Vec<_>>() {
            outcomes.push(delivery.await.unwrap());
        }
        let handled = outcomes.iter().filter(|o| **o == Received::Handled).count();
        let duplicates = outcomes.iter().filter(|o| **o == Received::Duplicate).count();
        assert_eq!((handled, duplicates), (1, 7), "round {round}: {outcomes:?}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3, "one handler call per message");
    assert_eq!(invoices(&pool).await, 3);
}

#[sqlx::test(migrations = false)]
async fn failures_roll_back_the_handlers_writes_and_count_until_the_message_is_dead(pool: PgPool) {
    setup(&pool).await;
    let inbox = Inbox::builder(pool.clone(), "billing")
        .max_attempts(3)
        .backoff(Backoff {
            base: Duration::from_secs(2),
            cap: Duration::from_secs(60),
            jitter: false,
        })
        .handler(|mut ctx: InboxContext, event: OrderPlaced| async move {
            sqlx::query("INSERT INTO invoices (order_id, cents) VALUES ($1, $2)")
                .bind(event.order_id)
                .bind(event.total_cents)
                .execute(&mut **ctx.tx())
                .await
                .unwrap();
            let cause = HandlerError("the card was declined".into());
            Err(std::io::Error::other(cause))
        })
        .build()
        .unwrap();
    let (id, event) = (Uuid::now_v7(), placed(990));
    let message = message_of(id, &event);
    let first = inbox.receive(&message).await.unwrap();
    assert_eq!(first, Received::Failed { attempts: 1, retry_in: Duration::from_secs(2) });
    assert!(!first.acknowledge());
    let second = inbox.receive(&message).await.unwrap();
    assert_eq!(second, Received::Failed { attempts: 2, retry_in: Duration::from_secs(4) });
    assert_eq!(inbox.receive(&message).await.unwrap(), Received::Dead);
    // Dead: acknowledged from now on, and the handler is not called.
    assert_eq!(inbox.receive(&message).await.unwrap(), Received::Dead);
    assert_eq!(invoices(&pool).await, 0, "every failed call's write rolled back");
    let (attempts, handled, dead, last_error, kept) = row(&pool, "billing", id).await;
    assert_eq!((attempts, handled, dead, kept), (3, false, true, true));
    assert_eq!(last_error.as_deref(), Some("the card was declined"));
    let payload: serde_json::Value = sqlx::query_scalar(
        "SELECT payload::jsonb FROM outbox.inbox WHERE consumer = 'billing' AND event_id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(payload, serde_json::to_value(&event).unwrap(), "the dead letter keeps the message");
}

#[sqlx::test(migrations = false)]
async fn a_failure_then_a_success_handles_the_message_once(pool: PgPool) {
    setup(&pool).await;
    let calls = Arc::new(AtomicU32::new(0));
    let inbox = Inbox::builder(pool.clone(), "billing")
        .state(calls.clone())
        .handler(|mut ctx: InboxContext<Arc<AtomicU32>>, event: OrderPlaced| async move {
            let earlier = ctx.attempts();
            assert_eq!(ctx.state().fetch_add(1, Ordering::SeqCst), earlier);
            assert_eq!(ctx.header("traceparent").map(str::len), Some(55));
            assert_eq!(ctx.aggregate_id(), event.order_id.to_string());
            sqlx::query("INSERT INTO invoices (order_id, cents) VALUES ($1, $2)")
                .bind(event.order_id)
                .bind(event.total_cents)
                .execute(&mut **ctx.tx())
                .await?;
            if earlier == 0 {
                return Err(HandlerError("upstream timed out".into()).into());
            }
            Ok::<_, outbox_runtime::BoxError>(())
        })
        .build()
        .unwrap();
    let id = Uuid::now_v7();
    let message = message_of(id, &placed(5));
    assert!(matches!(inbox.receive(&message).await.unwrap(), Received::Failed { attempts: 1, .. }));
    assert_eq!(inbox.receive(&message).await.unwrap(), Received::Handled);
    assert_eq!(inbox.receive(&message).await.unwrap(), Received::Duplicate);
    assert_eq!(invoices(&pool).await, 1);
    let (attempts, handled, dead, last_error, kept) = row(&pool, "billing", id).await;
    assert_eq!((attempts, handled, dead, kept), (1, true, false, false), "handled drops the copy");
    assert_eq!(last_error.as_deref(), Some("upstream timed out"));
}

#[sqlx::test(migrations = false)]
async fn rejected_messages_die_at_once_and_snoozed_ones_count_no_attempt(pool: PgPool) {
    setup(&pool).await;
    let inbox = Inbox::builder(pool.clone(), "billing")
        .handler(|_: InboxContext, event: OrderPlaced| async move {
            if event.total_cents < 0 {
                return Err(Reject::new("a negative total can never be billed").into());
            }
            if event.total_cents == 0 {
                return Err(Snooze::after(Duration::from_secs(7)).into());
            }
            panic!("the billing code panicked");
            #[allow(unreachable_code)]
            Ok::<_, outbox_runtime::BoxError>(())
        })
        .build()
        .unwrap();
    let rejected = Uuid::now_v7();
    assert_eq!(inbox.receive(&message_of(rejected, &placed(-1))).await.unwrap(), Received::Dead);
    let (attempts, _, dead, last_error, _) = row(&pool, "billing", rejected).await;
    assert_eq!((attempts, dead), (1, true));
    assert_eq!(
        last_error.as_deref(),
        Some("rejected by its handler: a negative total can never be billed")
    );

    let snoozed = Uuid::now_v7();
    let outcome = inbox.receive(&message_of(snoozed, &placed(0))).await.unwrap();
    assert_eq!(outcome, Received::Snoozed { delay: Duration::from_secs(7) });
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.inbox WHERE event_id = $1")
        .bind(snoozed)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(recorded, 0, "a snooze records nothing");

    let panicked = Uuid::now_v7();
    let outcome = inbox.receive(&message_of(panicked, &placed(3))).await.unwrap();
    assert!(matches!(outcome, Received::Failed { attempts: 1, .. }), "{outcome:?}");
    let (_, _, _, last_error, _) = row(&pool, "billing", panicked).await;
    assert_eq!(last_error.as_deref(), Some("handler panicked: the billing code panicked"));
}

#[sqlx::test(migrations = false)]
async fn a_connection_lost_in_the_handler_counts_no_attempt(pool: PgPool) {
    setup(&pool).await;
    let kill = Arc::new(AtomicU32::new(1));
    let inbox = Inbox::builder(pool.clone(), "billing")
        .state((pool.clone(), kill.clone()))
        .handler(|mut ctx: InboxContext<(PgPool, Arc<AtomicU32>)>, event: OrderPlaced| async move {
            sqlx::query("INSERT INTO invoices (order_id, cents) VALUES ($1, $2)")
                .bind(event.order_id)
                .bind(event.total_cents)
                .execute(&mut **ctx.tx())
                .await?;
            if ctx.state().1.swap(0, Ordering::SeqCst) == 1 {
                // An operator (or a failover) ends the handler's session before its commit.
                let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(&mut **ctx.tx())
                    .await?;
                sqlx::query("SELECT pg_terminate_backend($1)")
                    .bind(pid)
                    .execute(&ctx.state().0)
                    .await?;
            }
            Ok::<_, sqlx::Error>(())
        })
        .build()
        .unwrap();
    let id = Uuid::now_v7();
    let message = message_of(id, &placed(40));
    let error = inbox.receive(&message).await.unwrap_err();
    assert!(matches!(error, InboxError::Database(_)), "{error:?}");
    let recorded: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.inbox WHERE event_id = $1")
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(recorded, 0, "nothing committed, no attempt counted");
    // The broker delivers it again: handled, once.
    assert_eq!(inbox.receive(&message).await.unwrap(), Received::Handled);
    assert_eq!(invoices(&pool).await, 1);
    assert_eq!(row(&pool, "billing", id).await.0, 0);
}

#[sqlx::test(migrations = false)]
async fn messages_no_handler_takes_are_left_alone_and_bad_ones_are_refused(pool: PgPool) {
    setup(&pool).await;
    let inbox = Inbox::builder(pool.clone(), "billing").handler(bill).build().unwrap();
    let id = Uuid::now_v7().to_string();
    let renamed = [
        ("outbox-event-id", id.as_str()),
        ("outbox-event-type", "customer.renamed"),
        ("outbox-aggregate-type", "customer"),
        ("outbox-aggregate-id", "7"),
        ("outbox-event-version", "1"),
    ];
    let message =
        InboundMessage::from_headers(renamed, br#"{"customer_id":7,"name":"Ada"}"#).unwrap();
    assert_eq!(inbox.receive(&message).await.unwrap(), Received::NoHandler);

    let error = InboundMessage::from_headers(renamed[1..].iter().copied(), b"{}").unwrap_err();
    assert!(
        error.to_string().starts_with("not an outbox message (no `outbox-event-id` header)"),
        "{error}"
    );
    let mut bad_version = renamed;
    bad_version[4].1 = "0";
    let error = InboundMessage::from_headers(bad_version, b"{}").unwrap_err();
    assert!(
        error.to_string().contains("`outbox-event-version` is `0`: not a positive integer"),
        "{error}"
    );

    // A payload that does not decode is the handler's failure, kept with the decode error.
    let order = Uuid::now_v7().to_string();
    let garbled = [
        ("outbox-event-id", order.as_str()),
        ("outbox-event-type", OrderPlaced::EVENT_TYPE),
        ("outbox-aggregate-type", OrderPlaced::AGGREGATE_TYPE),
        ("outbox-aggregate-id", "1"),
        ("OUTBOX-EVENT-VERSION", "1"),
    ];
    let message = InboundMessage::from_headers(garbled, br#"{"order_id":"not a uuid"}"#).unwrap();
    assert!(matches!(inbox.receive(&message).await.unwrap(), Received::Failed { attempts: 1, .. }));
    let (_, _, _, last_error, kept) = row(&pool, "billing", message.event_id()).await;
    assert!(kept);
    assert!(last_error.unwrap().contains("order_id"), "the decode error names the field");
}

#[sqlx::test(migrations = false)]
async fn purging_deletes_old_handled_records_only(pool: PgPool) {
    setup(&pool).await;
    let inbox = Inbox::builder(pool.clone(), "billing")
        .max_attempts(1)
        .handler(|_: InboxContext, event: OrderPlaced| async move {
            if event.total_cents == 0 {
                return Err(HandlerError("no".into()));
            }
            Ok(())
        })
        .build()
        .unwrap();
    let handled: Vec<Uuid> = (0..5).map(|_| Uuid::now_v7()).collect();
    for id in &handled {
        assert_eq!(inbox.receive(&message_of(*id, &placed(1))).await.unwrap(), Received::Handled);
    }
    let dead = Uuid::now_v7();
    assert_eq!(inbox.receive(&message_of(dead, &placed(0))).await.unwrap(), Received::Dead);
    assert_eq!(
        inbox.purge_handled(Duration::from_secs(3600), 2).await.unwrap(),
        0,
        "none old enough"
    );
    sqlx::query("UPDATE outbox.inbox SET handled_at = handled_at - interval '2 hours' WHERE event_id = ANY($1)")
        .bind(&handled[..3])
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(inbox.purge_handled(Duration::from_secs(3600), 2).await.unwrap(), 3);
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT event_id FROM outbox.inbox ORDER BY event_id")
        .fetch_all(&pool)
        .await
        .unwrap();
    let mut expected = vec![handled[3], handled[4], dead];
    expected.sort();
    assert_eq!(left, expected, "the newer handled records and the dead letter stay");
}

/// Version 2 of a parcel: its weight in kilograms.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, OutboxEvent)]
#[outbox(aggregate = "parcel", event_type = "parcel.sent", version = 2)]
struct ParcelSentV2 {
    #[outbox(id)]
    parcel: i64,
    kilograms: i64,
}

/// Version 3: in grams. Version 1 (`"weight": "<n>kg"`) has no struct any more.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, OutboxEvent)]
#[outbox(aggregate = "parcel", event_type = "parcel.sent", version = 3, upcast_from = ParcelSentV2)]
struct ParcelSent {
    #[outbox(id)]
    parcel: i64,
    grams: i64,
}

impl From<ParcelSentV2> for ParcelSent {
    fn from(v2: ParcelSentV2) -> Self {
        ParcelSent { parcel: v2.parcel, grams: v2.kilograms * 1000 }
    }
}

/// A parcel message at `version`, with `payload`.
fn parcel_message(version: &str, payload: serde_json::Value) -> InboundMessage {
    let id = Uuid::now_v7().to_string();
    let headers = [
        ("outbox-event-id", id.as_str()),
        ("outbox-event-type", "parcel.sent"),
        ("outbox-aggregate-type", "parcel"),
        ("outbox-aggregate-id", "1"),
        ("outbox-event-version", version),
    ];
    InboundMessage::from_headers(headers, payload.to_string().as_bytes()).unwrap()
}

/// Version 1's `"weight": "<n>kg"` into version 2's `kilograms`.
fn v1_to_v2(mut v1: serde_json::Value) -> Result<serde_json::Value, HandlerError> {
    let weight = v1["weight"].take();
    let kilograms = weight.as_str().and_then(|w| w.strip_suffix("kg")).and_then(|k| k.parse().ok());
    let kilograms: i64 =
        kilograms.ok_or_else(|| HandlerError(format!("weight {weight} is not `<n>kg`")))?;
    v1["kilograms"] = kilograms.into();
    Ok(v1)
}

type SeenParcels = Arc<std::sync::Mutex<Vec<(u32, ParcelSent)>>>;

#[sqlx::test(migrations = false)]
async fn older_versions_are_read_through_the_chain_and_json_upcasters(pool: PgPool) {
    migrated(&pool).await;
    let seen = SeenParcels::default();
    let inbox = Inbox::builder(pool.clone(), "shipping")
        .state(seen.clone())
        .handler(|ctx: InboxContext<SeenParcels>, parcel: ParcelSent| async move {
            ctx.state().lock().unwrap().push((ctx.version(), parcel));
            Ok::<_, HandlerError>(())
        })
        .upcast_json::<ParcelSent, _>("parcel.sent", 1, v1_to_v2)
        .build()
        .unwrap();
    let v1 = parcel_message("1", serde_json::json!({ "parcel": 1, "weight": "2kg" }));
    let v2 = parcel_message("2", serde_json::json!({ "parcel": 2, "kilograms": 3 }));
    let v3 = parcel_message("3", serde_json::json!({ "parcel": 3, "grams": 40 }));
    let bad = parcel_message("1", serde_json::json!({ "parcel": 4, "weight": "heavy" }));
    for message in [&v1, &v2, &v3] {
        assert_eq!(inbox.receive(message).await.unwrap(), Received::Handled);
    }
    assert!(matches!(inbox.receive(&bad).await.unwrap(), Received::Failed { attempts: 1, .. }));
    let (_, _, _, last_error, _) = row(&pool, "shipping", bad.event_id()).await;
    let last_error = last_error.unwrap();
    assert!(last_error.contains("weight \"heavy\" is not `<n>kg`"), "{last_error}");
    let seen = seen.lock().unwrap().clone();
    let expected = [
        (1, ParcelSent { parcel: 1, grams: 2000 }),
        (2, ParcelSent { parcel: 2, grams: 3000 }),
        (3, ParcelSent { parcel: 3, grams: 40 }),
    ];
    assert_eq!(seen, expected);

    // An upcaster for a version the handler's chain reads itself is refused, as by the relay.
    let refused = Inbox::builder(pool.clone(), "shipping")
        .handler(|_: InboxContext, _: ParcelSent| async { Ok::<_, HandlerError>(()) })
        .upcast_json::<ParcelSent, _>("parcel.sent", 2, Ok::<_, HandlerError>)
        .build();
    assert!(refused.is_err());
}

/// A million records of consumer `billing`: handled over the last two days, one in 200 dead,
/// one in 200 failing; ids in time order.
const FILL: &str = "
    INSERT INTO outbox.inbox (consumer, event_id, aggregate_type, aggregate_id, event_type,
                              event_version, received_at, handled_at, attempts, dead_at,
                              last_error, payload, headers)
    SELECT 'billing', outbox.uuid_v7(), 'order', (i % 5000)::text, 'order.placed', 1,
           now() - interval '3 days',
           CASE WHEN i % 200 > 1 THEN now() - (i % 2880) * interval '1 minute' END,
           CASE WHEN i % 200 < 2 THEN 3 ELSE 0 END,
           CASE WHEN i % 200 = 0 THEN now() - interval '1 hour' END,
           CASE WHEN i % 200 < 2 THEN 'refused' END,
           CASE WHEN i % 200 < 2 THEN '{}' END,
           CASE WHEN i % 200 < 2 THEN '{}'::jsonb END
    FROM generate_series(1, 1000000) AS i";

#[sqlx::test(migrations = false)]
async fn every_inbox_statement_stays_on_its_index_on_a_million_records_with_empty_statistics(
    pool: PgPool,
) {
    use outbox_runtime::__private::test_hooks as hooks;
    use support::plans::*;

    migrated(&pool).await;
    sqlx::raw_sql(
        "ALTER TABLE outbox.inbox SET (autovacuum_enabled = false); ANALYZE outbox.inbox",
    )
    .execute(&pool)
    .await
    .unwrap();
    let key = "text, uuid, text, text, text, integer";
    let new_key = |id: Uuid| format!("'billing', '{id}', 'order', '1', 'order.placed', 1");
    let failure = "text, boolean, integer, text, jsonb";
    let failed = "'boom', false, 10, '{}', '{}'";
    // (name, SQL, parameter types, the run on the empty inbox, local setting)
    let prepared = [
        ("claim", hooks::INBOX_CLAIM, key.to_owned(), new_key(Uuid::now_v7()), None),
        (
            "is_dead",
            hooks::INBOX_IS_DEAD,
            "text, uuid".to_owned(),
            format!("'billing', '{}'", Uuid::nil()),
            Some(hooks::INDEXES_ONLY),
        ),
        (
            "fail",
            hooks::INBOX_FAIL,
            format!("{key}, {failure}"),
            format!("{}, {failed}", new_key(Uuid::now_v7())),
            None,
        ),
        (
            "dead",
            hooks::INBOX_DEAD,
            "text, bigint".to_owned(),
            "'billing', 50".to_owned(),
            Some(hooks::INDEXES_ONLY),
        ),
        (
            "count_dead",
            hooks::INBOX_COUNT_DEAD,
            "text".to_owned(),
            "'billing'".to_owned(),
            Some(hooks::INDEXES_ONLY),
        ),
        (
            "discard",
            hooks::INBOX_DISCARD,
            "text, uuid".to_owned(),
            format!("'billing', '{}'", Uuid::nil()),
            Some(hooks::INDEXES_ONLY),
        ),
        (
            "revive",
            hooks::INBOX_REVIVE,
            "text, uuid, integer".to_owned(),
            format!("'billing', '{}', 9", Uuid::nil()),
            Some(hooks::INDEXES_ONLY),
        ),
        (
            "purge",
            hooks::INBOX_PURGE_HANDLED,
            "text, bigint, bigint".to_owned(),
            "'billing', 3600000000, 1000".to_owned(),
            Some(hooks::INDEXES_ONLY),
        ),
    ];
    let mut conn = pool.acquire().await.unwrap().detach();
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan").execute(&mut conn).await.unwrap();
    for (name, sql, parameters, first, local) in &prepared {
        let prepare = format!("PREPARE {name}({parameters}) AS {sql}");
        sqlx::raw_sql(sqlx::static_sql(prepare)).execute(&mut conn).await.unwrap();
        let local = local.unwrap_or("SELECT 1");
        let run = format!("BEGIN; {local}; EXECUTE {name}({first}); ROLLBACK");
        sqlx::raw_sql(sqlx::static_sql(run)).execute(&mut conn).await.unwrap();
    }

    sqlx::raw_sql(FILL).execute(&pool).await.unwrap();
    let id_where = |condition: &str| {
        let sql = format!("SELECT event_id FROM outbox.inbox WHERE {condition} LIMIT 1");
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, Uuid>(sqlx::static_sql(sql)).fetch_one(&pool).await.unwrap()
        }
    };
    let handled = id_where("handled_at IS NOT NULL").await;
    let dead = id_where("dead_at IS NOT NULL").await;
    let failing = id_where("handled_at IS NULL AND dead_at IS NULL").await;
    let old: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.inbox WHERE handled_at < now() - interval '47 hours'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(old > 1000);
    let dead_count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.inbox WHERE dead_at IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(dead_count, 5000);
    // (name, arguments, rows it returns or changes, most rows it may read)
    let measured = [
        ("claim", new_key(Uuid::now_v7()), 1, 2),
        ("claim", new_key(handled), 0, 2),
        ("claim", new_key(failing), 1, 2),
        ("is_dead", format!("'billing', '{dead}'"), 1, 2),
        ("fail", format!("{}, {failed}", new_key(failing)), 1, 2),
        ("dead", "'billing', 50".to_owned(), 50, 4 * 50 + 10),
        ("count_dead", "'billing'".to_owned(), 1, 4 * 5000 + 10),
        ("discard", format!("'billing', '{dead}'"), 1, 2),
        ("revive", format!("'billing', '{dead}', 9"), 1, 2),
        ("purge", format!("'billing', {}, 1000", 47 * 3_600_000_000_i64), 1000, 4 * 1000 + 10),
    ];
    for (name, arguments, touches, most_read) in measured {
        let local = prepared.iter().find(|(each, ..)| *each == name).unwrap().4;
        let statement = Statement {
            name,
            sql: "",
            parameters: "",
            first: String::new(),
            measured: arguments,
            touches,
            local,
        };
        let plan = explain(&mut conn, &statement).await;
        let root = &plan[0]["Plan"];
        assert!(!has_seq_scan(root), "{name} scans the inbox: {plan:#}");
        // All but the deletes return what they changed or found.
        let deletes = matches!(name, "purge" | "discard");
        let changed = if deletes { touched(root) } else { root["Actual Rows"].as_i64().unwrap() };
        assert_eq!(changed, touches, "{name}: {plan:#}");
        let read = rows_read(root);
        assert!(read <= most_read, "{name} read {read} rows, at most {most_read}: {plan:#}");
    }
}

#[sqlx::test(migrations = false)]
async fn dead_messages_are_listed_discarded_and_requeued_from_what_the_inbox_kept(pool: PgPool) {
    use outbox_runtime::inbox::dead_letters;
    use std::sync::atomic::AtomicBool;

    setup(&pool).await;
    let fixed = Arc::new(AtomicBool::new(false));
    let inbox = Inbox::builder(pool.clone(), "billing")
        .state(fixed.clone())
        .max_attempts(2)
        .handler(|mut ctx: InboxContext<Arc<AtomicBool>>, event: OrderPlaced| async move {
            if !ctx.state().load(Ordering::SeqCst) {
                return Err(HandlerError(format!("the ledger refused {}", event.total_cents)));
            }
            assert_eq!(ctx.header("traceparent").map(str::len), Some(55), "headers kept");
            sqlx::query("INSERT INTO invoices (order_id, cents) VALUES ($1, $2)")
                .bind(event.order_id)
                .bind(event.total_cents)
                .execute(&mut **ctx.tx())
                .await
                .map_err(|e| HandlerError(e.to_string()))?;
            Ok(())
        })
        .build()
        .unwrap();
    let (first, second) = (Uuid::now_v7(), Uuid::now_v7());
    for (id, cents) in [(first, 10), (second, 20)] {
        let message = message_of(id, &placed(cents));
        assert!(matches!(inbox.receive(&message).await.unwrap(), Received::Failed { .. }));
        assert_eq!(inbox.receive(&message).await.unwrap(), Received::Dead);
    }
    assert_eq!(dead_letters::count(&pool, "billing").await.unwrap(), 2);
    assert_eq!(dead_letters::count(&pool, "audit").await.unwrap(), 0, "per consumer");
    let dead = dead_letters::list(&pool, "billing", 10).await.unwrap();
    let listed: Vec<(Uuid, u32, Option<&str>)> =
        dead.iter().map(|d| (d.event_id, d.attempts, d.last_error.as_deref())).collect();
    assert_eq!(
        listed,
        [(first, 2, Some("the ledger refused 10")), (second, 2, Some("the ledger refused 20"))],
        "the longest dead first"
    );
    let payload: serde_json::Value = serde_json::from_str(&dead[0].payload).unwrap();
    assert_eq!(payload["total_cents"], 10);

    // Still broken: requeued, it fails once and is dead again, with the new error.
    assert_eq!(inbox.requeue_dead(first).await.unwrap(), Some(Received::Dead));
    assert_eq!(dead_letters::count(&pool, "billing").await.unwrap(), 2);
    // Fixed: handled from the kept message, once; then nothing is left to requeue.
    fixed.store(true, Ordering::SeqCst);
    assert_eq!(inbox.requeue_dead(first).await.unwrap(), Some(Received::Handled));
    assert_eq!(inbox.requeue_dead(first).await.unwrap(), None);
    assert_eq!(inbox.receive(&message_of(first, &placed(10))).await.unwrap(), Received::Duplicate);
    assert_eq!(invoices(&pool).await, 1);

    assert!(dead_letters::discard(&pool, "billing", second).await.unwrap());
    assert!(!dead_letters::discard(&pool, "billing", second).await.unwrap());
    assert!(!dead_letters::discard(&pool, "billing", first).await.unwrap(), "handled, not dead");
    assert_eq!(dead_letters::count(&pool, "billing").await.unwrap(), 0);
}

#[sqlx::test(migrations = false)]
async fn every_outcome_is_counted_per_consumer_type_and_outcome(pool: PgPool) {
    use support::counting::{Counted, Increment};
    setup(&pool).await;
    let counted = Counted::default();
    // This test's thread only: the runtime of `sqlx::test` runs every task on it.
    let _recorder = metrics::set_default_local_recorder(&counted);
    let inbox = Inbox::builder(pool.clone(), "billing")
        .max_attempts(2)
        .handler(|_: InboxContext, event: OrderPlaced| async move {
            match event.total_cents {
                0 => Err(HandlerError("no".into())),
                _ => Ok(()),
            }
        })
        .build()
        .unwrap();
    let handled = message_of(Uuid::now_v7(), &placed(1));
    let failing = message_of(Uuid::now_v7(), &placed(0));
    for message in [&handled, &handled, &failing, &failing] {
        inbox.receive(message).await.unwrap();
    }
    let outcomes: Vec<Increment> = counted.increments();
    let label = |outcome: &str| {
        let labels = ["consumer=billing", "event_type=order.placed", &format!("outcome={outcome}")];
        ("outbox_inbox_received_total".to_owned(), labels.map(str::to_owned).to_vec(), 1)
    };
    assert_eq!(outcomes, [label("handled"), label("duplicate"), label("failed"), label("dead")]);
}
