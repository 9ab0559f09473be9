//! Transactional handlers: the handler's writes and the event's acknowledgement commit in one
//! transaction, so a database effect happens exactly once.

use std::future::Future;
use std::ops::Deref;

use sqlx::{Postgres, Transaction};
use tokio::sync::oneshot;

use crate::error::BoxError;
use crate::event::OutboxEvent;
use crate::relay::context::EventContext;
use crate::relay::handler::{
    decode, DecodeError, DeliveryLease, HandlerFuture, Route, RouteFuture, RowMeta, Settled,
    TypedRoute,
};
use crate::store;

/// An async function that handles one event type inside a transaction the relay opens:
/// `async fn(TransactionContext<S>, E) -> Result<(), Err>`.
///
/// The relay begins a transaction on the builder's pool, hands it to the handler through
/// [`TransactionContext::tx`], and when the handler returns `Ok`, marks the event published in
/// that same transaction (fenced by the lease like every acknowledgement) and commits. If the
/// handler fails, the acknowledgement is refused, or the relay dies, neither the handler's writes
/// nor the acknowledgement commit. A projection updated this way is updated exactly once.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a transactional outbox handler",
    label = "expected `async fn(TransactionContext<S>, E) -> Result<(), Err>`",
    note = "a transactional handler takes the context, which owns the transaction, and the event: \
            `async fn(mut ctx: TransactionContext<S>, event: E) -> Result<(), Err>`, \
            where `E: OutboxEvent` and `Err: Into<BoxError>`"
)]
pub trait TransactionalHandler<E, S>: Clone + Send + Sync + 'static {
    /// Runs the handler.
    fn call(&self, ctx: TransactionContext<S>, event: E) -> HandlerFuture;
}

impl<F, Fut, E, S, Err> TransactionalHandler<E, S> for F
where
    F: Fn(TransactionContext<S>, E) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Err>> + Send + 'static,
    Err: Into<BoxError>,
{
    fn call(&self, ctx: TransactionContext<S>, event: E) -> HandlerFuture {
        let future = self(ctx, event);
        Box::pin(async move { future.await.map_err(Into::into) })
    }
}

/// The context of a transactional handler: everything [`EventContext`] has (through `Deref`),
/// plus the transaction the event is acknowledged in.
///
/// ```no_run
/// # use outbox_runtime::{OutboxEvent, TransactionContext};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize, OutboxEvent)]
/// # #[outbox(aggregate = "order", event_type = "order.placed")]
/// # struct OrderPlaced { #[outbox(id)] order_id: i64, total_cents: i64 }
/// async fn project(mut ctx: TransactionContext, event: OrderPlaced) -> Result<(), sqlx::Error> {
///     sqlx::query("UPDATE revenue SET cents = cents + $1")
///         .bind(event.total_cents)
///         .execute(&mut **ctx.tx())
///         .await?;
///     Ok(())
/// }
/// ```
pub struct TransactionContext<S = ()> {
    event: EventContext<S>,
    /// `Some` until dropped: then it goes back to the relay, to acknowledge and commit.
    tx: Option<Transaction<'static, Postgres>>,
    back: Option<oneshot::Sender<Transaction<'static, Postgres>>>,
}

impl<S> TransactionContext<S> {
    /// The transaction the event is acknowledged in. Write through it (`&mut **ctx.tx()` is an
    /// executor) and emit follow-up events with it: they commit together with the
    /// acknowledgement, or not at all. Do not commit it yourself.
    pub fn tx(&mut self) -> &mut Transaction<'static, Postgres> {
        self.tx.as_mut().expect("the transaction is only taken when the context is dropped")
    }
}

impl<S> Deref for TransactionContext<S> {
    type Target = EventContext<S>;

    fn deref(&self) -> &EventContext<S> {
        &self.event
    }
}

impl<S> Drop for TransactionContext<S> {
    fn drop(&mut self) {
        if let (Some(tx), Some(back)) = (self.tx.take(), self.back.take()) {
            // If the relay stopped waiting, dropping the transaction rolls it back.
            let _ = back.send(tx);
        }
    }
}

/// A transactional handler and its event type, erased behind [`Route`].
pub(crate) struct TransactionalRoute<H, E>(pub(crate) TypedRoute<H, E>);

impl<H, E, S> Route<S> for TransactionalRoute<H, E>
where
    H: TransactionalHandler<E, S>,
    E: OutboxEvent + Send + 'static,
    S: Send + 'static,
{
    fn call(
        &self,
        state: S,
        meta: RowMeta,
        payload: &str,
        lease: DeliveryLease,
    ) -> Result<RouteFuture, DecodeError> {
        let event: E = decode(payload)?;
        let handler = self.0.handler.clone();
        Ok(Box::pin(async move {
            let tx = lease.pool.begin().await?;
            let (back, returned) = oneshot::channel();
            let ctx = TransactionContext {
                event: EventContext::new(state, meta),
                tx: Some(tx),
                back: Some(back),
            };
            // On failure the context was dropped with the handler's future: the transaction
            // comes back below, or was dropped, and rolls back either way.
            handler.call(ctx, event).await?;
            let mut tx = returned.await.map_err(|_| "the handler's transaction was lost")?;
            let published = match lease.lease.token() {
                Some(token) => store::publish_in(&mut tx, lease.lease.event_id(), token).await?,
                None => false,
            };
            if !published {
                tx.rollback().await?;
                return Ok(Settled::LeaseLost);
            }
            // The row is locked by this transaction now: no relay can take it over, however
            // long the commit takes.
            lease.lease.commit_started();
            tx.commit().await?;
            Ok(Settled::Published)
        }))
    }
}
