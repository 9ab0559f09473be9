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
