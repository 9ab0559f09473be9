//! Typed handlers outside, one erased route per event type inside.
//!
//! One [`Handler`] trait with one blanket impl: the handler's context type chooses how it is
//! delivered ([`HandlerContext`]: plain with `EventContext`, or in the acknowledgement's
//! transaction with `TransactionContext`, in `transactional.rs`). A single impl lets rustc pick
//! it before checking the rest, so a wrong event, future or context type gets its own precise
//! error instead of a bare "not a handler".

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;

use crate::decode::{read, DecodeError, JsonUpcasters};
use crate::error::BoxError;
use crate::event::OutboxEvent;
use crate::relay::context::{EventContext, RowMeta};
use crate::relay::held::HeldLease;
use crate::store::OnPublish;

/// An async function that handles one event type, found from its arguments:
/// `async fn(EventContext<S>, E) -> Result<(), Err>`, or, to write in the transaction the
/// event is acknowledged in, `async fn(TransactionContext<S>, E) -> Result<(), Err>`.
///
/// Implemented for every such function and closure where `E` is an [`OutboxEvent`] and `Err`
/// converts into [`BoxError`] (any `std::error::Error + Send + Sync + 'static`, or
/// `anyhow::Error`). The relay finds the event type from `E`, so it is never spelled twice. `M`
/// is a marker, `(context, event)`, that tells the two kinds apart; it is always inferred.
///
/// Sealed: functions of that shape are the only handlers, and no other type can implement it.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an outbox handler",
    label = "expected `async fn(EventContext<S>, E) -> Result<(), Err>`",
    note = "a handler takes the context and the event, `async fn(ctx: EventContext<S>, event: E) -> Result<(), Err>` \
            (or `TransactionContext<S>` to write in the acknowledgement's transaction), \
            where `E: OutboxEvent`, `Err: Into<BoxError>` (e.g. any `std::error::Error + Send + Sync + 'static`), \
            `S` is the relay's state type (`()` if none), and the future is `Send`"
)]
pub trait Handler<M, S>: sealed::IntoRoute<M, S> + Clone + Send + Sync + 'static {
    /// The event type the handler takes.
    type Event: OutboxEvent;
}

impl<F, Fut, C, E, S, Err> Handler<(C, E), S> for F
where
    F: Fn(C, E) -> Fut + Clone + Send + Sync + 'static,
    C: HandlerContext<S>,
    E: OutboxEvent + Send + 'static,
    Fut: Future<Output = Result<(), Err>> + Send + 'static,
    Err: Into<BoxError>,
{
    type Event = E;
}

impl<F, Fut, C, E, S, Err> sealed::IntoRoute<(C, E), S> for F
where
    F: Fn(C, E) -> Fut + Clone + Send + Sync + 'static,
    C: HandlerContext<S>,
    E: OutboxEvent + Send + 'static,
    Fut: Future<Output = Result<(), Err>> + Send + 'static,
    Err: Into<BoxError>,
{
    fn into_route(self) -> ErasedRoute<S> {
        C::route(self)
    }
}

/// The first argument of a [`Handler`]: [`EventContext<S>`], or
/// [`TransactionContext<S>`](crate::TransactionContext) to write in the transaction the event is
/// acknowledged in. `S` is the relay's state type. Sealed: implemented by those two only.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not the context of a handler on a relay with state `{S}`",
    label = "expected `EventContext<{S}>` or `TransactionContext<{S}>`",
    note = "a handler's first argument is `EventContext<S>`, or `TransactionContext<S>` to write in the \
            acknowledgement's transaction, where `S` is the type given to `RelayBuilder::state` (`()` if none)"
)]
pub trait HandlerContext<S>: sealed::Route<S> + Sized + Send + 'static {}

impl<S: Send + 'static> HandlerContext<S> for EventContext<S> {}

impl<S: Send + 'static> sealed::Route<S> for EventContext<S> {
    fn route<F, Fut, E, Err>(handler: F) -> ErasedRoute<S>
    where
        F: Fn(Self, E) -> Fut + Clone + Send + Sync + 'static,
        E: OutboxEvent + Send + 'static,
        Fut: Future<Output = Result<(), Err>> + Send + 'static,
        Err: Into<BoxError>,
    {
        ErasedRoute(Box::new(PlainRoute { handler, _event: PhantomData }))
    }
}

/// What makes [`Handler`] and [`HandlerContext`] sealed: their workings live in traits that
/// only this crate can name (public in a private module).
pub(crate) mod sealed {
    use std::future::Future;

    use super::ErasedRoute;
    use crate::error::BoxError;
    use crate::event::OutboxEvent;

    /// A handler turned into the relay's erased route.
    pub trait IntoRoute<M, S> {
        fn into_route(self) -> ErasedRoute<S>;
    }

    /// The route that delivers to `handler` with this context.
    pub trait Route<S>: Sized {
        fn route<F, Fut, E, Err>(handler: F) -> ErasedRoute<S>
        where
            F: Fn(Self, E) -> Fut + Clone + Send + Sync + 'static,
            E: OutboxEvent + Send + 'static,
            Fut: Future<Output = Result<(), Err>> + Send + 'static,
            Err: Into<BoxError>;
    }
}

/// A handler erased behind [`Route`]; opaque outside the crate.
pub struct ErasedRoute<S>(pub(crate) Box<dyn Route<S>>);

/// How a delivery that did not fail ended.
pub(crate) enum Settled {
    /// The handler succeeded; the acknowledger publishes the row.
    Handled,
    /// The handler's transaction published the row itself.
    Published,
    /// The handler's transaction found the lease taken over and rolled back.
    LeaseLost,
    /// Not delivered, and not the event's fault: the sink or the database was unavailable
    /// (why, cause included). The row goes back to pending with no attempt counted.
    Unavailable(String),
}

pub(crate) type RouteFuture =
    Pin<Box<dyn Future<Output = Result<Settled, BoxError>> + Send + 'static>>;

/// The lease a delivery runs under, for routes that acknowledge in their own transaction.
pub(crate) struct DeliveryLease {
    /// The pool handed to the builder: handler transactions run there.
    pub(crate) pool: crate::store::Db,
    pub(crate) lease: HeldLease,
    /// Whether the acknowledgement marks the row published or deletes it.
    pub(crate) on_publish: OnPublish,
}

/// A leased row's payload as stored, with the relay's JSON upcasters to read older versions.
#[derive(Clone, Copy)]
pub(crate) struct Payload<'a> {
    pub(crate) json: &'a str,
    pub(crate) upcasters: &'a JsonUpcasters,
}

impl Payload<'_> {
    /// The payload read as `E`, through its versions.
    pub(crate) fn read<E: OutboxEvent>(self, meta: &RowMeta) -> Result<E, DecodeError> {
        read(&meta.event_type, meta.version, self.json, self.upcasters)
    }
}

/// The type-erased form of a handler: decode, then call.
pub(crate) trait Route<S>: Send + Sync {
    fn call(
        &self,
        state: S,
        meta: RowMeta,
        payload: Payload<'_>,
        lease: DeliveryLease,
    ) -> Result<RouteFuture, DecodeError>;

    /// Whether the route writes in the transaction that acknowledges its row, which a relay
    /// holding its rows in a transaction of its own cannot give it.
    fn is_transactional(&self) -> bool {
        false
    }
}

/// A plain handler and the event type it takes.
struct PlainRoute<F, E> {
    handler: F,
    _event: PhantomData<fn() -> E>,
}

impl<F, Fut, E, S, Err> Route<S> for PlainRoute<F, E>
where
    F: Fn(EventContext<S>, E) -> Fut + Send + Sync,
    Fut: Future<Output = Result<(), Err>> + Send + 'static,
    Err: Into<BoxError>,
    E: OutboxEvent,
    S: Send + 'static,
{
    fn call(
        &self,
        state: S,
        meta: RowMeta,
        payload: Payload<'_>,
        _: DeliveryLease,
    ) -> Result<RouteFuture, DecodeError> {
        let event = payload.read(&meta)?;
        let handling = (self.handler)(EventContext::new(state, meta), event);
        Ok(Box::pin(async move { handling.await.map(|()| Settled::Handled).map_err(Into::into) }))
    }
}

/// A route registered for `EventContext<()>`, carried over when the builder gains a state.
pub(crate) struct Stateless(pub(crate) Box<dyn Route<()>>);

impl<S> Route<S> for Stateless {
    fn call(
        &self,
        _state: S,
        meta: RowMeta,
        payload: Payload<'_>,
        lease: DeliveryLease,
    ) -> Result<RouteFuture, DecodeError> {
        self.0.call((), meta, payload, lease)
    }

    fn is_transactional(&self) -> bool {
        self.0.is_transactional()
    }
}
