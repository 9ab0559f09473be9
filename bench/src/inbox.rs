//! The inbox (issue #24): one consumer receiving messages through `Inbox::receive`, against
//! plain SQL doing the same work by hand: in one transaction per message, record its id with
//! `INSERT ... ON CONFLICT DO NOTHING`, decode the payload, write the effect, commit. Both run
//! the same messages with the same number of concurrent receivers, first as new messages, then
//! all again as duplicates; each in a database of its own.

use std::sync::Arc;
use std::time::Instant;

use outbox_runtime::inbox::{InboundMessage, Inbox, InboxContext, Received};
use outbox_runtime::OutboxEvent;
use sqlx::PgPool;
use uuid::Uuid;

use crate::db::Database;
use crate::events::{credited, Credited};

/// Messages/s of a run: new, then again as duplicates.
pub struct Rates {
    pub new: f64,
    pub duplicates: f64,
}

/// `count` messages as a forwarding relay would send them.
fn messages(count: usize) -> Vec<InboundMessage> {
    (0..count)
        .map(|i| {
            let id = Uuid::now_v7().to_string();
            let event = credited(i);
            let aggregate = event.account.to_string();
            let headers = [
                ("outbox-event-id", id.as_str()),
                ("outbox-event-type", Credited::EVENT_TYPE),
                ("outbox-aggregate-type", Credited::AGGREGATE_TYPE),
                ("outbox-aggregate-id", aggregate.as_str()),
                ("outbox-event-version", "1"),
            ];
            InboundMessage::from_headers(headers, &serde_json::to_vec(&event).unwrap()).unwrap()
        })
        .collect()
}

const EFFECTS: &str = "CREATE TABLE effects (event_id uuid PRIMARY KEY, cents bigint NOT NULL)";

async fn effect(
    tx: &mut sqlx::PgConnection,
    event_id: Uuid,
    cents: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO effects (event_id, cents) VALUES ($1, $2)")
        .bind(event_id)
        .bind(cents)
        .execute(tx)
        .await
        .map(|_| ())
}

/// Runs `receive` over `messages` with `receivers` tasks; returns messages/s.
async fn timed<F, Fut>(messages: &Arc<Vec<InboundMessage>>, receivers: usize, receive: F) -> f64
where
    F: Fn(InboundMessage) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..receivers)
        .map(|r| {
            let (messages, receive) = (messages.clone(), receive.clone());
            tokio::spawn(async move {
                for message in messages.iter().skip(r).step_by(receivers) {
                    receive(message.clone()).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    messages.len() as f64 / started.elapsed().as_secs_f64()
}

async fn bill(mut ctx: InboxContext, event: Credited) -> Result<(), sqlx::Error> {
    let event_id = ctx.event_id();
    effect(ctx.tx(), event_id, event.cents).await
}

/// The inbox's rates.
pub async fn inbox(url: &str, count: usize, receivers: usize) -> Rates {
    let db = Database::fresh(url, "inbox").await;
    sqlx::query(EFFECTS).execute(&db.pool).await.unwrap();
    let inbox = Inbox::builder(db.pool.clone(), "bench").handler(bill).build().unwrap();
    let messages = Arc::new(messages(count));
    let run = |expected: Received| {
        let inbox = inbox.clone();
        move |message: InboundMessage| {
            let (inbox, expected) = (inbox.clone(), expected.clone());
            async move { assert_eq!(inbox.receive(&message).await.unwrap(), expected) }
        }
    };
    let new = timed(&messages, receivers, run(Received::Handled)).await;
    let duplicates = timed(&messages, receivers, run(Received::Duplicate)).await;
    check(&db.pool, count).await;
    db.drop().await;
    Rates { new, duplicates }
}

/// The same by hand.
pub async fn plain_sql(url: &str, count: usize, receivers: usize) -> Rates {
    let db = Database::fresh(url, "inbox_sql").await;
    sqlx::query(EFFECTS).execute(&db.pool).await.unwrap();
    sqlx::query(
        "CREATE TABLE received (consumer text, event_id uuid, PRIMARY KEY (consumer, event_id))",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let messages = Arc::new(messages(count));
    let run = |pool: PgPool, new: bool| {
        move |message: InboundMessage| {
            let pool = pool.clone();
            async move {
                let mut tx = pool.begin().await.unwrap();
                let recorded = sqlx::query(
                    "INSERT INTO received (consumer, event_id) VALUES ('bench', $1) \
                     ON CONFLICT DO NOTHING",
                )
                .bind(message.event_id())
                .execute(&mut *tx)
                .await
                .unwrap();
                assert_eq!(recorded.rows_affected() == 1, new);
                if new {
                    let event: Credited = serde_json::from_str(message.payload()).unwrap();
                    effect(&mut tx, message.event_id(), event.cents).await.unwrap();
                }
                tx.commit().await.unwrap();
            }
        }
    };
    let new = timed(&messages, receivers, run(db.pool.clone(), true)).await;
    let duplicates = timed(&messages, receivers, run(db.pool.clone(), false)).await;
    check(&db.pool, count).await;
    db.drop().await;
    Rates { new, duplicates }
}

/// Panics unless each message had its effect once.
async fn check(pool: &PgPool, count: usize) {
    let effects: i64 =
        sqlx::query_scalar("SELECT count(*) FROM effects").fetch_one(pool).await.unwrap();
    assert_eq!(effects, count as i64, "effects after every message, new and repeated");
}
