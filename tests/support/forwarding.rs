//! What every broker's forwarding tests do alike: emit the standard events, forward them until
//! published or until their first failure, and drive a sink that refuses a share of messages.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use outbox_runtime::forward::{OutboundMessage, Sink, SinkError};

pub struct Flaky<S> {
    pub inner: S,
    pub fail_percent: u64,
}

impl<S: Sink> Sink for Flaky<S> {
    fn check(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        self.inner.check()
    }

    fn send<'a>(
        &'a self,
        batch: &'a [OutboundMessage],
    ) -> BoxFuture<'a, Vec<Result<(), SinkError>>> {
        Box::pin(async move {
            let refused: Vec<bool> =
                batch.iter().map(|_| fastrand::u64(0..100) < self.fail_percent).collect();
            let passed: Vec<OutboundMessage> = batch
                .iter()
                .zip(&refused)
                .filter(|(_, &refused)| !refused)
                .map(|(message, _)| message.clone())
                .collect();
            let mut published = self.inner.send(&passed).await.into_iter();
            batch
                .iter()
                .zip(refused)
                .map(|(message, refused)| match refused {
                    true => Err(SinkError::refused(&message.destination, "refused by the test")),
                    false => published.next().expect("one outcome per message"),
                })
                .collect()
        })
    }
}

/// A sink whose broker the test takes away and gives back: while away, every publish and check
/// answers unavailable, as a broker out of reach does. Counts the checks (the relay's probes).
pub struct Away<S> {
    inner: S,
    switch: Switch,
}

/// The test's side of an [`Away`] sink.
#[derive(Clone, Default)]
pub struct Switch {
    away: Arc<AtomicBool>,
    checks: Arc<AtomicUsize>,
}

impl<S: Sink> Away<S> {
    pub fn new(inner: S) -> (Self, Switch) {
        let switch = Switch::default();
        (Away { inner, switch: switch.clone() }, switch)
    }
}

impl Switch {
    pub fn take_away(&self) {
        self.away.store(true, Ordering::SeqCst);
    }

    pub fn give_back(&self) {
        self.away.store(false, Ordering::SeqCst);
    }

    /// How many times the relay checked the sink.
    pub fn checks(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }

    fn is_away(&self) -> bool {
        self.away.load(Ordering::SeqCst)
    }
}

impl<S: Sink> Sink for Away<S> {
    fn check(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        self.switch.checks.fetch_add(1, Ordering::SeqCst);
        match self.switch.is_away() {
            true => Box::pin(async { Err(SinkError::unavailable("the broker", "away")) }),
            false => self.inner.check(),
        }
    }

    fn send<'a>(
        &'a self,
        batch: &'a [OutboundMessage],
    ) -> BoxFuture<'a, Vec<Result<(), SinkError>>> {
        if !self.switch.is_away() {
            return self.inner.send(batch);
        }
        let away = |m: &OutboundMessage| Err(SinkError::unavailable(&m.destination, "away"));
        let outcomes = batch.iter().map(away).collect();
        Box::pin(async move { outcomes })
    }
}

/// Accounts and events per account of [`forward_ordered_through_failures`].
pub const ORDERED_ACCOUNTS: u32 = 4;
pub const ORDERED_EVENTS: u32 = 25;

/// Emits [`ORDERED_EVENTS`] ordered events for each of [`ORDERED_ACCOUNTS`] accounts, then
/// forwards them through `sink` refusing 30% of the messages, to destinations
/// `<prefix>.account.<account>`, until every event is published; the sink must have refused
/// some.
pub async fn forward_ordered_through_failures(pool: &sqlx::PgPool, sink: impl Sink, prefix: &str) {
    use outbox_runtime::forward::Forward;
    use outbox_runtime::Relay;

    use super::accounts::posted;
    use super::{count_published, eventually, fast, Running};

    for n in 0..ORDERED_EVENTS {
        let mut tx = pool.begin().await.unwrap();
        for account in 0..ORDERED_ACCOUNTS {
            outbox_runtime::emit(&mut tx, &posted(account, n)).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
    let destination = format!("{prefix}.{{aggregate_type}}.{{aggregate_id}}");
    let flaky = Flaky { inner: sink, fail_percent: 30 };
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .forward(Forward::to(flaky).destination(&destination))
            .max_attempts(1_000),
    );
    let total = i64::from(ORDERED_ACCOUNTS * ORDERED_EVENTS);
    eventually("every event is published", || async { count_published(pool).await == total }).await;
    let counts = relay.stop().await;
    assert!(counts.failed > 0, "the sink refused some messages: {counts:?}");
}

/// Checks what a consumer received, `(destination, n)` in arrival order: per account, each
/// event once, in emit order.
pub fn assert_in_emit_order(received: impl IntoIterator<Item = (String, u64)>) {
    let mut per_account: std::collections::HashMap<String, Vec<u64>> = Default::default();
    for (destination, n) in received {
        let account = destination.rsplit('.').next().unwrap().to_owned();
        per_account.entry(account).or_default().push(n);
    }
    assert_eq!(per_account.len(), ORDERED_ACCOUNTS as usize, "every account: {per_account:?}");
    let expected: Vec<u64> = (0..u64::from(ORDERED_EVENTS)).collect();
    for (account, ns) in per_account {
        assert_eq!(ns, expected, "account {account}: each event once, in emit order");
    }
}

/// The `traceparent` header the standard events carry.
pub const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Emits two `order.placed` events (totals 1 and 2) with headers `traceparent` and
/// `tenant: acme` in one committed transaction, and a third in one rolled back; returns the
/// committed ids.
pub async fn emit_two_and_roll_back_one(pool: &sqlx::PgPool) -> Vec<uuid::Uuid> {
    use super::placed;

    let mut tx = pool.begin().await.unwrap();
    let options = outbox_runtime::EmitOptions::new()
        .header("traceparent", TRACEPARENT)
        .header("tenant", "acme");
    let kept =
        outbox_runtime::emit_all_with(&mut tx, &[placed(1), placed(2)], options).await.unwrap();
    tx.commit().await.unwrap();
    let mut rolled_back = pool.begin().await.unwrap();
    outbox_runtime::emit(&mut rolled_back, &placed(3)).await.unwrap();
    rolled_back.rollback().await.unwrap();
    kept
}

/// Runs `builder` until `events` rows are published; asserts it published them without a
/// failure.
pub async fn forward_until_published(
    pool: &sqlx::PgPool,
    builder: outbox_runtime::RelayBuilder,
    events: i64,
) {
    use super::{count_published, eventually, Running};

    let relay = Running::start(builder);
    eventually("the events are published", || async { count_published(pool).await == events })
        .await;
    let counts = relay.stop().await;
    assert_eq!((counts.delivered, counts.failed), (events as u64, 0));
}

/// Emits one event and forwards it with `forward` until its first failure is recorded (the
/// retry is a minute away); asserts the row is kept pending and returns its `last_error`.
pub async fn first_failure(
    pool: &sqlx::PgPool,
    forward: outbox_runtime::forward::Forward,
) -> String {
    use std::time::Duration;

    use outbox_runtime::{Backoff, Relay};

    use super::{emit_committed, eventually, placed, row_state, Running};

    let id = emit_committed(pool, &[placed(1)]).await[0];
    let minute = Duration::from_secs(60);
    let relay = Running::start(
        Relay::builder(pool.clone())
            .forward(forward)
            .poll_interval(Duration::from_millis(50))
            .backoff(Backoff { base: minute, cap: minute, jitter: false }),
    );
    eventually("the failure is recorded", || async { row_state(pool, id).await.attempts == 1 })
        .await;
    relay.stop().await;
    let row = row_state(pool, id).await;
    assert!(!row.published && !row.dead, "still pending, to retry");
    row.last_error.expect("the failure is kept")
}

/// Emits one 2 MiB `customer.renamed` event (over every broker's default limit) and two small
/// `order.placed` ones, forwards them with `builder` (retries a minute away) until the small ones
/// are published and the large one's first failure is recorded; asserts it is kept pending and
/// returns its `last_error`.
pub async fn a_message_too_large(
    pool: &sqlx::PgPool,
    builder: outbox_runtime::RelayBuilder,
) -> String {
    use std::time::Duration;

    use outbox_runtime::Backoff;

    use super::{
        emit_committed, eventually, placed, row_state, until_published, CustomerRenamed, Running,
    };

    let large = CustomerRenamed { customer_id: 1, name: "x".repeat(2 * 1024 * 1024) };
    let mut tx = pool.begin().await.unwrap();
    let large_id = outbox_runtime::emit(&mut tx, &large).await.unwrap();
    tx.commit().await.unwrap();
    let small = emit_committed(pool, &[placed(1), placed(2)]).await;
    let minute = Duration::from_secs(60);
    let relay =
        Running::start(builder.backoff(Backoff { base: minute, cap: minute, jitter: false }));
    for id in &small {
        until_published(pool, *id).await;
    }
    eventually("the large event's failure is recorded", || async {
        row_state(pool, large_id).await.attempts == 1
    })
    .await;
    relay.stop().await;
    let row = row_state(pool, large_id).await;
    assert!(!row.published && !row.dead, "kept, to retry or to inspect");
    row.last_error.expect("the failure is kept")
}

/// Runs a relay forwarding to `sink` until it stops at start, as it must when the sink's check
/// fails (within 20 s); returns the sink's error.
pub async fn sink_error_at_start(pool: &sqlx::PgPool, sink: impl Sink) -> SinkError {
    use std::time::Duration;

    use outbox_runtime::forward::Forward;
    use outbox_runtime::{Error, Relay};

    let relay = Relay::builder(pool.clone()).forward(Forward::to(sink)).build().unwrap();
    let result =
        tokio::time::timeout(Duration::from_secs(20), relay.run_until(std::future::pending()))
            .await
            .expect("the relay stops at once");
    let Err(Error::Sink(error)) = result else { panic!("expected a sink error, got {result:?}") };
    error
}
