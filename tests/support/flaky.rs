//! A real sink that refuses a share of the messages before they reach the broker, as a broker
//! that drops connections or refuses messages would.

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

    fn publish<'a>(
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
            let mut published = self.inner.publish(&passed).await.into_iter();
            batch
                .iter()
                .zip(refused)
                .map(|(message, refused)| match refused {
                    true => Err(SinkError::new(&message.destination, "refused by the test")),
                    false => published.next().expect("one outcome per message"),
                })
                .collect()
        })
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
