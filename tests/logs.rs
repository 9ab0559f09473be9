//! What the relay's log lines say, read from a subscriber the tests install: each carries its
//! error's whole chain of causes, and a failed delivery names its event, type and cause without
//! quoting the payload.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use outbox_runtime::{EventContext, Relay};
use sqlx::PgPool;
use support::*;

/// Everything logged at WARN and above in this test binary, as text.
fn logged() -> String {
    static LINES: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    let lines = LINES.get_or_init(|| {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let written = lines.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || Capture(written.clone()))
            .init();
        lines
    });
    String::from_utf8_lossy(&lines.lock().unwrap()).into_owned()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The logged lines that contain every one of `parts`.
fn lines_with(parts: &[&str]) -> Vec<String> {
    logged()
        .lines()
        .filter(|line| parts.iter().all(|part| line.contains(part)))
        .map(str::to_owned)
        .collect()
}

#[sqlx::test(migrations = false)]
async fn a_lease_that_fails_logs_the_databases_cause(pool: PgPool) {
    logged();
    migrated(&pool).await;
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .handler(|_: EventContext, _: OrderPlaced| async { Ok::<_, HandlerError>(()) }),
    );
    let cause = "terminating connection due to administrator command";
    eventually("a failed lease is logged with its cause", || async {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = 'outbox-relay-lease'",
        )
        .execute(&pool)
        .await
        .unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        !lines_with(&["cannot lease outbox events", cause]).is_empty()
    })
    .await;
    relay.stop().await;
    let line = &lines_with(&["cannot lease outbox events", cause])[0];
    assert!(line.contains("outbox database error: "), "the error, then its cause: {line}");
}

#[sqlx::test(migrations = false)]
async fn a_failed_delivery_names_its_event_type_and_cause_but_not_the_payload(pool: PgPool) {
    logged();
    migrated(&pool).await;
    let secret = "s3cret-in-the-payload";
    let mut tx = pool.begin().await.unwrap();
    let renamed = CustomerRenamed { customer_id: 7, name: secret.into() };
    let refused = outbox_runtime::emit(&mut tx, &renamed).await.unwrap();
    // A payload the handler's type cannot read, the offending value being the secret.
    let undecodable: uuid::Uuid = sqlx::query_scalar(
        "INSERT INTO outbox.events (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ('order', '1', 'order.placed', jsonb_build_object('order_id', $1::text), '{}') \
         RETURNING event_id",
    )
    .bind(secret)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();

    async fn refuses(_: EventContext, _: CustomerRenamed) -> Result<(), HandlerError> {
        Err(HandlerError("the mail service said 550 mailbox unavailable".into()))
    }
    async fn takes(_: EventContext, _: OrderPlaced) -> Result<(), HandlerError> {
        Ok(())
    }
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).handler(refuses).handler(takes).max_attempts(1),
    );
    for id in [refused, undecodable] {
        eventually("the event is dead", || async { row_state(&pool, id).await.dead }).await;
    }
    relay.stop().await;

    let failed = "outbox event delivery failed";
    let handler = lines_with(&[failed, &refused.to_string()]);
    assert_eq!(handler.len(), 1, "{}", logged());
    assert!(handler[0].contains("customer.renamed"), "the event type: {}", handler[0]);
    assert!(handler[0].contains("550 mailbox unavailable"), "the cause: {}", handler[0]);
    let decode = lines_with(&[failed, &undecodable.to_string()]);
    assert_eq!(decode.len(), 1, "{}", logged());
    assert!(decode[0].contains("order.placed"), "the event type: {}", decode[0]);
    assert!(decode[0].contains("does not deserialize into"), "the cause: {}", decode[0]);
    assert!(decode[0].contains("order_id"), "where: {}", decode[0]);
    assert!(!logged().contains(secret), "no payload in any log line: {}", logged());
    let kept = row_state(&pool, undecodable).await.last_error.unwrap();
    assert!(kept.contains("does not deserialize into"), "last_error keeps the details: {kept}");
}

#[sqlx::test(migrations = false)]
async fn an_inbox_message_that_does_not_decode_is_logged_without_its_payload(pool: PgPool) {
    use outbox_runtime::inbox::{InboundMessage, Inbox, InboxContext, Received};

    logged();
    migrated(&pool).await;
    let inbox = Inbox::builder(pool.clone(), "billing")
        .max_attempts(2)
        .handler(|_: InboxContext, _: OrderPlaced| async { Ok::<_, HandlerError>(()) })
        .build()
        .unwrap();
    let secret = "s3cret-in-the-inbox-payload";
    let id = uuid::Uuid::now_v7().to_string();
    let headers = [
        ("outbox-event-id", id.as_str()),
        ("outbox-event-type", "order.placed"),
        ("outbox-aggregate-type", "order"),
        ("outbox-aggregate-id", "1"),
        ("outbox-event-version", "1"),
    ];
    // serde's error quotes the offending string: the secret.
    let order_id = uuid::Uuid::now_v7();
    let payload = serde_json::json!({ "order_id": order_id, "total_cents": secret }).to_string();
    let message = InboundMessage::from_headers(headers, payload.as_bytes()).unwrap();
    assert!(matches!(inbox.receive(&message).await.unwrap(), Received::Failed { .. }));
    assert_eq!(inbox.receive(&message).await.unwrap(), Received::Dead);

    let failed = lines_with(&["inbox handler failed", &id]);
    assert_eq!(failed.len(), 1, "{}", logged());
    assert!(failed[0].contains("does not deserialize into"), "the cause: {}", failed[0]);
    assert!(failed[0].contains("total_cents"), "where: {}", failed[0]);
    assert_eq!(lines_with(&["inbox message dead", &id]).len(), 1, "{}", logged());
    assert!(!logged().contains(secret), "no payload in any log line: {}", logged());
    let kept: String =
        sqlx::query_scalar("SELECT last_error FROM outbox.inbox").fetch_one(&pool).await.unwrap();
    assert!(kept.contains(secret), "last_error keeps the details: {kept}");
}
