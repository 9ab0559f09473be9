//! Typed handlers outside, one erased route per event type inside.

use std::any::type_name;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::BoxError;
use crate::event::OutboxEvent;
use crate::relay::context::EventContext;
use crate::relay::held::Held;

/// A boxed handler future.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'static>>;

/// An async function that handles one event type: `async fn(EventContext<S>, E) -> Result<(), Err>`.
///
/// Implemented for every such function and closure where `E` is an [`OutboxEvent`] and `Err`
/// converts into [`BoxError`] (any `std::error::Error + Send + Sync + 'static`, or
/// `anyhow::Error`). The relay finds the event type from `E`, so it is never spelled twice.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an outbox handler",
    label = "expected `async fn(EventContext<S>, E) -> Result<(), Err>`",
    note = "a handler takes the context and the event, `async fn(ctx: EventContext<S>, event: E) -> Result<(), Err>`, \
            where `E: OutboxEvent`, `Err: Into<BoxError>` (e.g. any `std::error::Error + Send + Sync + 'static`), \
            `S` is the relay's state type (`()` if none), and the future is `Send`"
)]
pub trait Handler<E, S>: Clone + Send + Sync + 'static {
    /// Runs the handler.
    fn call(&self, ctx: EventContext<S>, event: E) -> HandlerFuture;
}

impl<F, Fut, E, S, Err> Handler<E, S> for F
where
    F: Fn(EventContext<S>, E) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<(), Err>> + Send + 'static,
    Err: Into<BoxError>,
{
    fn call(&self, ctx: EventContext<S>, event: E) -> HandlerFuture {
        let future = self(ctx, event);
        Box::pin(async move { future.await.map_err(Into::into) })
    }
}

/// What the relay knows of a leased row besides its payload.
pub(crate) struct RowMeta {
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_id: String,
    pub(crate) headers: serde_json::Value,
    pub(crate) attempt: u32,
    pub(crate) created_at: DateTime<Utc>,
}

/// The payload did not deserialize into the handler's event type.
#[derive(Debug, thiserror::Error)]
#[error("payload does not deserialize into `{type_name}`: {source}")]
pub(crate) struct DecodeError {
    type_name: &'static str,
    source: serde_json::Error,
}

/// How a delivery that did not fail ended.
pub(crate) enum Settled {
    /// The handler succeeded; the acknowledger publishes the row.
    Handled,
    /// The handler's transaction published the row itself.
    Published,
    /// The handler's transaction found the lease taken over and rolled back.
    LeaseLost,
}

pub(crate) type RouteFuture =
    Pin<Box<dyn Future<Output = Result<Settled, BoxError>> + Send + 'static>>;

/// The lease a delivery runs under, for routes that acknowledge in their own transaction.
pub(crate) struct Lease {
    /// The pool handed to the builder: handler transactions run there.
    pub(crate) pool: sqlx::PgPool,
    pub(crate) event_id: Uuid,
    pub(crate) held: Held,
    /// The token the row was leased with; `held` has the current one if it was re-leased.
    pub(crate) token: Uuid,
}

/// The type-erased form of a handler: decode, then call.
pub(crate) trait Route<S>: Send + Sync {
    fn call(
        &self,
        state: S,
        meta: RowMeta,
        payload: &str,
        lease: Lease,
    ) -> Result<RouteFuture, DecodeError>;
}

/// Decodes a payload into the handler's event type.
pub(crate) fn decode<E: OutboxEvent>(payload: &str) -> Result<E, DecodeError> {
    serde_json::from_str(payload)
        .map_err(|source| DecodeError { type_name: type_name::<E>(), source })
}

/// A typed handler and the event type it takes, erased behind [`Route`].
pub(crate) struct TypedRoute<H, E> {
    pub(crate) handler: H,
    pub(crate) _event: PhantomData<fn() -> E>,
}

impl<H, E> TypedRoute<H, E> {
    pub(crate) fn new(handler: H) -> Self {
        Self { handler, _event: PhantomData }
    }
}

impl<H, E, S> Route<S> for TypedRoute<H, E>
where
    H: Handler<E, S>,
    E: OutboxEvent,
    S: Send + 'static,
{
    fn call(
        &self,
        state: S,
        meta: RowMeta,
        payload: &str,
        _: Lease,
    ) -> Result<RouteFuture, DecodeError> {
        let handling = self.handler.call(EventContext::new(state, meta), decode(payload)?);
        Ok(Box::pin(async move { handling.await.map(|()| Settled::Handled) }))
    }
}

/// A route registered for `EventContext<()>`, carried over when the builder gains a state.
pub(crate) struct Stateless(pub(crate) Box<dyn Route<()>>);

impl<S> Route<S> for Stateless {
    fn call(
        &self,
        _state: S,
        meta: RowMeta,
        payload: &str,
        lease: Lease,
    ) -> Result<RouteFuture, DecodeError> {
        self.0.call((), meta, payload, lease)
    }
}
