//! Transactional handlers: the handler's writes and the event's acknowledgement commit in one
//! transaction, so a database effect happens exactly once.
//!
//! A handler whose context is a [`TransactionContext`] is one: the relay begins a transaction on
//! the builder's pool, hands it to the handler through [`TransactionContext::tx`], and when the
//! handler returns `Ok`, marks the event published in that same transaction (fenced by the lease
//! like every acknowledgement) and commits.

use std::future::Future;
use std::marker::PhantomData;
use std::ops::Deref;

use sqlx::{Postgres, Transaction};
use tokio::sync::oneshot;

use crate::decode::DecodeError;
use crate::error::{is_unavailable, BoxError, ErrorChain};
use crate::event::OutboxEvent;
use crate::relay::context::{EventContext, RowMeta};
use crate::relay::handler::{
    sealed, DeliveryLease, ErasedRoute, HandlerContext, Payload, Route, RouteFuture, Settled,
};
use crate::store;

/// The context of a transactional handler: everything [`EventContext`] has (through `Deref`),
/// plus the transaction the event is acknowledged in.
///
/// ```no_run
/// # use outbox_runtime::sqlx;
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

impl<S: Send + 'static> HandlerContext<S> for TransactionContext<S> {}

impl<S: Send + 'static> sealed::Route<S> for TransactionContext<S> {
    fn route<F, Fut, E, Err>(handler: F) -> ErasedRoute<S>
    where
        F: Fn(Self, E) -> Fut + Clone + Send + Sync + 'static,
        E: OutboxEvent + Send + 'static,
        Fut: Future<Output = Result<(), Err>> + Send + 'static,
        Err: Into<BoxError>,
    {
        ErasedRoute(Box::new(TransactionalRoute { handler, _event: PhantomData }))
    }
}

/// A transactional handler and the event type it takes. If the handler fails, the
/// acknowledgement is refused, or the relay dies, neither the handler's writes nor the
/// acknowledgement commit.
struct TransactionalRoute<F, E> {
    handler: F,
    _event: PhantomData<fn() -> E>,
}

impl<F, Fut, E, S, Err> Route<S> for TransactionalRoute<F, E>
where
    F: Fn(TransactionContext<S>, E) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Err>> + Send + 'static,
    Err: Into<BoxError>,
    E: OutboxEvent + Send + 'static,
    S: Send + 'static,
{
    fn is_transactional(&self) -> bool {
        true
    }

    fn call(
        &self,
        state: S,
        meta: RowMeta,
        payload: Payload<'_>,
        lease: DeliveryLease,
    ) -> Result<RouteFuture, DecodeError> {
        let event: E = payload.read(&meta)?;
        let handler = self.handler.clone();
        Ok(Box::pin(async move {
            // The database's own failures around the handler (a pool exhausted, the database
            // away, a connection lost at commit) are not the event's: its row is handed back
            // with no attempt counted. A commit whose connection was lost may still have
            // published the row; then the hand-back finds it settled. A commit the database
            // refused (a deferred constraint the handler's writes broke) is the handler's
            // failure, like any error of its own statements.
            let unavailable = |what: &str, error: sqlx::Error| {
                let why = format!("{what}: {}", ErrorChain(&error));
                tracing::warn!(
                    %why,
                    "outbox event not delivered: the database was unavailable to its transactional \
                     handler; handed back with no attempt counted"
                );
                Settled::Unavailable(why)
            };
            // `build` refuses transactional handlers on the other databases.
            let Some(pool) = lease.pool.postgres() else {
                return Err("transactional handlers need PostgreSQL".into());
            };
            let tx = match pool.begin().await {
                Ok(tx) => tx,
                Err(error) => {
                    return Ok(unavailable("cannot begin the handler's transaction", error))
                }
            };
            let (back, returned) = oneshot::channel();
            let ctx = TransactionContext {
                event: EventContext::new(state, meta),
                tx: Some(tx),
                back: Some(back),
            };
            // On failure the context was dropped with the handler's future: the transaction
            // comes back below, or was dropped, and rolls back either way.
            handler(ctx, event).await.map_err(Into::<BoxError>::into)?;
            let mut tx = returned.await.map_err(|_| "the handler's transaction was lost")?;
            let published = match lease.lease.token() {
                Some(token) => {
                    let event_id = lease.lease.event_id();
                    match store::publish_in(&mut tx, event_id, token, lease.on_publish).await {
                        Ok(published) => published,
                        Err(error) if is_unavailable(&error) => {
                            return Ok(unavailable("cannot acknowledge the event", error))
                        }
                        Err(error) => return Err(error.into()),
                    }
                }
                None => false,
            };
            if !published {
                // Dropping the transaction rolls it back, whatever the connection's state.
                drop(tx);
                return Ok(Settled::LeaseLost);
            }
            // The row is locked by this transaction now: no relay can take it over, however
            // long the commit takes.
            lease.lease.commit_started();
            match tx.commit().await {
                Ok(()) => Ok(Settled::Published),
                Err(error) if is_unavailable(&error) => Ok(unavailable(
                    "the handler's transaction lost its connection at commit",
                    error,
                )),
                Err(error) => Err(error.into()),
            }
        }))
    }
}
