//! Assembling a relay: state, handlers, settings; conflicts are found by `build`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Backend;
use crate::decode::{JsonUpcaster, JsonUpcasters};
use crate::error::BoxError;
use crate::event::{EventType, OutboxEvent};
use crate::forward::{Forward, ForwardRoute, SinkHealth};
use crate::relay::config::{
    Backoff, DeadOrderedEvents, HandlerOptions, LeaseMode, NewerVersions, RelayConfig,
    UnknownEvents,
};
use crate::relay::forwarding::Forwarding;
use crate::relay::handler::{Handler, Route, Stateless};
use crate::relay::held::HeldRows;
use crate::relay::metrics::RelayMetrics;
use crate::relay::pace::ORDERED_BATCH_SIZE;
use crate::relay::registry::Registration;
use crate::relay::{Plan, Relay, Routed, Routes, Subscribed, Subscribers};
use crate::store::{Db, LeasePlan, LeaseTypes, OnPublish, TypeVersions};

/// The default concurrency of a relay that forwards to a broker.
const FORWARDING_CONCURRENCY: usize = 256;

/// Builds a [`Relay`]; start with [`Relay::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct RelayBuilder<S = ()> {
    /// The database, or the name of one the relay does not run on yet.
    pool: Result<Db, &'static str>,
    state: S,
    handlers: Vec<Registered<S>>,
    upcasters: Vec<Upcaster>,
    forward: Option<Forward>,
    /// The subscriber name `forward` forwards as, if it is a subscriber.
    forward_as: Option<String>,
    /// Set by [`RelayBuilder::concurrency`]; the default depends on forwarding.
    concurrency: Option<usize>,
    config: RelayConfig,
}

struct Registered<S> {
    /// The subscriber's name; `None` for a handler of the type's own (`handler`).
    subscriber: Option<String>,
    aggregate_type: &'static str,
    event_types: &'static [EventType],
    event_name: &'static str,
    route: Box<dyn Route<S>>,
    options: HandlerOptions,
}

/// A JSON upcaster as registered, checked against the handlers by `build` (the relay's and the
/// inbox's).
pub(crate) struct Upcaster {
    aggregate_type: &'static str,
    event_type: String,
    from_version: u32,
    upcaster: JsonUpcaster,
}

impl Upcaster {
    /// `upcaster` for `E`'s aggregate's `event_type` at `from_version`.
    pub(crate) fn new<E, Err>(
        event_type: &str,
        from_version: u32,
        upcaster: impl Fn(serde_json::Value) -> Result<serde_json::Value, Err> + Send + Sync + 'static,
    ) -> Self
    where
        E: OutboxEvent,
        Err: Into<BoxError>,
    {
        Upcaster {
            aggregate_type: E::AGGREGATE_TYPE,
            event_type: event_type.to_owned(),
            from_version,
            upcaster: Box::new(move |value| upcaster(value).map_err(Into::into)),
        }
    }
}

/// Why [`RelayBuilder::build`] refused to build a relay.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// Two handlers were registered for one `(aggregate_type, event_type)`: two versions of
    /// one event, or an enum family and one of its variants' structs.
    #[error(
        "two handlers for aggregate `{aggregate_type}`, event type `{event_type}` \
         (events `{first}` and `{second}`): register one handler per event type"
    )]
    DuplicateHandler {
        /// The aggregate type both handlers take.
        aggregate_type: &'static str,
        /// The event type both handlers take.
        event_type: &'static str,
        /// The Rust event type of the first handler.
        first: &'static str,
        /// The Rust event type of the second handler.
        second: &'static str,
    },
    /// No handler was registered, so the relay would deliver nothing.
    #[error("the relay has no handlers: register at least one with `handler`")]
    NoHandlers,
    /// A forwarded event type also has a handler: the relay would not know where its rows go.
    #[error(
        "aggregate `{aggregate_type}`, event type `{event_type}` is both forwarded and handled \
         (by `{handler}`): forward it or handle it"
    )]
    ForwardedAndHandled {
        /// The aggregate type.
        aggregate_type: String,
        /// The event type.
        event_type: String,
        /// The Rust event type of the handler.
        handler: &'static str,
    },
    /// A JSON upcaster that no handler would run.
    #[error(
        "JSON upcaster of aggregate `{aggregate_type}`, event type `{event_type}` from version \
         {from_version}: {reason}"
    )]
    InvalidUpcaster {
        /// The aggregate type it was registered for.
        aggregate_type: &'static str,
        /// The event type it was registered for.
        event_type: String,
        /// The version it reads.
        from_version: u32,
        /// Why it would never run.
        reason: String,
    },
    /// A setting is out of range.
    #[error("invalid relay setting: {0}")]
    InvalidSetting(&'static str),
    /// A handler writes in the acknowledgement's transaction
    /// ([`TransactionContext`](crate::TransactionContext)), which [`LeaseMode::HeldTransaction`]
    /// cannot give it: the relay's own transaction holds the rows.
    #[error(
        "the handler of `{handler}` writes in the acknowledgement's transaction \
         (`TransactionContext`), which a relay with `LeaseMode::HeldTransaction` cannot give it: \
         take `EventContext`, or keep `LeaseMode::Written`"
    )]
    TransactionalHandler {
        /// The Rust event type of the handler.
        handler: &'static str,
    },
    /// A subscriber's name breaks the grammar of names.
    #[error(
        "invalid subscriber name {name:?}: use 1 to 128 lowercase letters, digits, \"_\", \".\" \
         and \"-\", starting with a letter"
    )]
    InvalidSubscriberName {
        /// The name given.
        name: String,
    },
    /// Two subscribers of one event type share a name.
    #[error(
        "two subscribers named `{subscriber}` for aggregate `{aggregate_type}`, event type \
         `{event_type}`: give each subscriber of a type its own name"
    )]
    DuplicateSubscriber {
        /// The name both have.
        subscriber: String,
        /// The aggregate type both take.
        aggregate_type: String,
        /// The event type both take.
        event_type: String,
    },
    /// An event type has both a handler of its own and subscribers: with subscribers, every
    /// delivery of the type goes to a named subscriber.
    #[error(
        "aggregate `{aggregate_type}`, event type `{event_type}` has a handler (`handler`) and \
         subscribers (`subscriber`): register the handler as a subscriber too, with a name of \
         its own"
    )]
    HandledAndSubscribed {
        /// The aggregate type.
        aggregate_type: &'static str,
        /// The event type.
        event_type: &'static str,
    },
    /// What the relay was asked for is not available on its database yet.
    #[error(
        "{what} is not available on {backend} yet: use PostgreSQL for it (the README's table \
         of guarantees per database says what each one gives)"
    )]
    Unsupported {
        /// The database: `"SQLite"`, `"MySQL"`.
        backend: &'static str,
        /// What it lacks.
        what: &'static str,
    },
    /// A forwarding destination template names a placeholder no row field fills.
    #[error(
        "invalid forwarding destination: {0} is not a placeholder; use {{aggregate_type}}, \
         {{event_type}} or {{aggregate_id}}"
    )]
    InvalidDestination(String),
}

impl Relay<()> {
    /// Starts building a relay that leases from the outbox through `pool`.
    ///
    /// Handlers are free to use `pool` (transactional handlers do). On PostgreSQL the relay's
    /// own statements run on up to six connections it opens with the pool's connect options:
    /// one to lease, up to four to acknowledge and renew, for retention and gauges, and to
    /// register for wake-ups, and one to LISTEN for new events. On SQLite they run on `pool`
    /// (see the README's table of what each database gives).
    pub fn builder<DB: Backend>(pool: sqlx::Pool<DB>) -> RelayBuilder<()> {
        RelayBuilder {
            pool: DB::relay_db(pool),
            state: (),
            handlers: Vec::new(),
            upcasters: Vec::new(),
            forward: None,
            forward_as: None,
            concurrency: None,
            config: RelayConfig::default(),
        }
    }
}

impl RelayBuilder<()> {
    /// Shared state handed to every handler through [`EventContext::state`](crate::EventContext::state),
    /// cloned per delivery (put an `Arc` or a pool inside). Handlers registered before this
    /// call keep taking `EventContext<()>`.
    pub fn state<S: Clone + Send + Sync + 'static>(self, state: S) -> RelayBuilder<S> {
        let handlers = self
            .handlers
            .into_iter()
            .map(|h| Registered {
                subscriber: h.subscriber,
                aggregate_type: h.aggregate_type,
                event_types: h.event_types,
                event_name: h.event_name,
                route: Box::new(Stateless(h.route)) as Box<dyn Route<S>>,
                options: h.options,
            })
            .collect();
        RelayBuilder {
            pool: self.pool,
            state,
            handlers,
            upcasters: self.upcasters,
            forward: self.forward,
            forward_as: self.forward_as,
            concurrency: self.concurrency,
            config: self.config,
        }
    }
}

impl<S: Clone + Send + Sync + 'static> RelayBuilder<S> {
    /// Registers `handler` for the event type of its second argument. A handler whose context
    /// is a [`TransactionContext`](crate::TransactionContext) writes in the transaction the event
    /// is acknowledged in: its writes and the acknowledgement commit together, exactly once.
    ///
    /// ```no_run
    /// # use outbox_runtime::sqlx;
    /// # use outbox_runtime::{EventContext, OutboxEvent, Relay};
    /// # use serde::{Deserialize, Serialize};
    /// # #[derive(Serialize, Deserialize, OutboxEvent)]
    /// # #[outbox(aggregate = "order", event_type = "order.placed")]
    /// # struct OrderPlaced { #[outbox(id)] order_id: i64 }
    /// async fn on_placed(ctx: EventContext, event: OrderPlaced) -> Result<(), std::io::Error> {
    ///     println!("order {} placed ({} earlier failures)", event.order_id, ctx.attempts());
    ///     Ok(())
    /// }
    /// # fn build(pool: sqlx::PgPool) -> Result<(), outbox_runtime::BuildError> {
    /// let relay = Relay::builder(pool).handler(on_placed).build()?;
    /// # Ok(()) }
    /// ```
    pub fn handler<M, H: Handler<M, S>>(self, handler: H) -> Self {
        self.handler_with(handler, HandlerOptions::new())
    }

    /// Registers `handler` like [`handler`](Self::handler), with its own timeout, most attempts
    /// or backoff where they differ from the relay's.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use outbox_runtime::sqlx;
    /// # use outbox_runtime::{EventContext, HandlerOptions, OutboxEvent, Relay};
    /// # use serde::{Deserialize, Serialize};
    /// # #[derive(Serialize, Deserialize, OutboxEvent)]
    /// # #[outbox(aggregate = "order", event_type = "order.placed")]
    /// # struct OrderPlaced { #[outbox(id)] order_id: i64 }
    /// # async fn charge_card(_: EventContext, _: OrderPlaced) -> Result<(), std::io::Error> { Ok(()) }
    /// # fn build(pool: sqlx::PgPool) -> Result<(), outbox_runtime::BuildError> {
    /// let slow_provider = HandlerOptions::new().timeout(Some(Duration::from_secs(60))).max_attempts(3);
    /// let relay = Relay::builder(pool).handler_with(charge_card, slow_provider).build()?;
    /// # Ok(()) }
    /// ```
    pub fn handler_with<M, H: Handler<M, S>>(self, handler: H, options: HandlerOptions) -> Self {
        self.register(None, handler, options)
    }

    /// Registers `handler` as the subscriber `name` of its event type: one of any number, each
    /// with its own attempts, backoff, dead letters and per-aggregate order, so a failing
    /// subscriber neither holds back nor repeats the others (see [the crate's
    /// docs](crate#subscribers)). Relays in other processes may run other subscribers of the
    /// same type.
    ///
    /// `name` names the subscriber's state in the outbox: keep it when the code changes, and
    /// remove it ([`subscribers::remove`](crate::subscribers::remove), `outbox subscribers
    /// remove`) when the subscriber is gone for good. Names use the grammar of event types:
    /// lowercase letters, digits, `_`, `.` and `-`, starting with a letter.
    ///
    /// ```no_run
    /// # use outbox_runtime::sqlx;
    /// # use outbox_runtime::{EventContext, OutboxEvent, Relay};
    /// # use serde::{Deserialize, Serialize};
    /// # #[derive(Serialize, Deserialize, OutboxEvent)]
    /// # #[outbox(aggregate = "order", event_type = "order.placed")]
    /// # struct OrderPlaced { #[outbox(id)] order_id: i64 }
    /// # async fn send_receipt(_: EventContext, _: OrderPlaced) -> Result<(), std::io::Error> { Ok(()) }
    /// # async fn index_order(_: EventContext, _: OrderPlaced) -> Result<(), std::io::Error> { Ok(()) }
    /// # fn build(pool: sqlx::PgPool) -> Result<(), outbox_runtime::BuildError> {
    /// let relay = Relay::builder(pool)
    ///     .subscriber("receipts", send_receipt)
    ///     .subscriber("search-index", index_order)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn subscriber<M, H: Handler<M, S>>(self, name: &str, handler: H) -> Self {
        self.subscriber_with(name, handler, HandlerOptions::new())
    }

    /// Registers the subscriber `name` like [`subscriber`](Self::subscriber), with its own
    /// timeout, most attempts or backoff where they differ from the relay's.
    pub fn subscriber_with<M, H: Handler<M, S>>(
        self,
        name: &str,
        handler: H,
        options: HandlerOptions,
    ) -> Self {
        self.register(Some(name.to_owned()), handler, options)
    }

    fn register<M, H: Handler<M, S>>(
        mut self,
        subscriber: Option<String>,
        handler: H,
        options: HandlerOptions,
    ) -> Self {
        self.handlers.push(Registered {
            subscriber,
            aggregate_type: H::Event::AGGREGATE_TYPE,
            event_types: H::Event::EVENT_TYPES,
            event_name: std::any::type_name::<H::Event>(),
            route: handler.into_route().0,
            options,
        });
        self
    }

    /// Registers a JSON upcaster: it turns the payload of `event_type` (of `E`'s aggregate)
    /// written at `from_version` into the payload of the next version, for versions whose
    /// structs are gone. A row older than the oldest version `E` reads through its
    /// `upcast_from` chain goes through the upcasters, one version at a time, then the chain.
    /// An error is a failed delivery naming the versions. `build` refuses an upcaster that no
    /// handler would run.
    ///
    /// ```no_run
    /// # use outbox_runtime::{sqlx, EventContext, OutboxEvent, Relay};
    /// # use serde::{Deserialize, Serialize};
    /// #[derive(Serialize, Deserialize, OutboxEvent)]
    /// #[outbox(aggregate = "order", event_type = "order.placed", version = 2)]
    /// struct OrderPlaced { #[outbox(id)] order_id: i64, total_cents: i64 }
    ///
    /// # async fn on_placed(_: EventContext, _: OrderPlaced) -> Result<(), std::io::Error> { Ok(()) }
    /// # fn build(pool: sqlx::PgPool) -> Result<(), outbox_runtime::BuildError> {
    /// // Version 1 stored `total` in whole units; its struct is long gone.
    /// let relay = Relay::builder(pool)
    ///     .handler(on_placed)
    ///     .upcast_json::<OrderPlaced, _>("order.placed", 1, |mut v1| {
    ///         let total = v1["total"].as_i64().ok_or("total is not an integer")?;
    ///         v1["total_cents"] = (total * 100).into();
    ///         Ok::<_, &str>(v1)
    ///     })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn upcast_json<E, Err>(
        mut self,
        event_type: &str,
        from_version: u32,
        upcaster: impl Fn(serde_json::Value) -> Result<serde_json::Value, Err> + Send + Sync + 'static,
    ) -> Self
    where
        E: OutboxEvent,
        Err: Into<BoxError>,
    {
        self.upcasters.push(Upcaster::new::<E, Err>(event_type, from_version, upcaster));
        self
    }

    /// Forwards events to a broker (see [`forward`](crate::forward)): every type no handler
    /// takes, or the types named with [`Forward::only`]. A row is published once the broker
    /// confirmed its message; a refusal is a failed delivery, retried with backoff and dead
    /// after `max_attempts`. The sink is checked when the relay starts.
    ///
    /// ```no_run
    /// # use outbox_runtime::sqlx;
    /// # #[cfg(feature = "nats")]
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// use outbox_runtime::forward::{nats::NatsSink, Forward};
    ///
    /// let client = async_nats::connect("127.0.0.1:4222").await?;
    /// let sink = NatsSink::new(client, "EVENTS");
    /// let relay = outbox_runtime::Relay::builder(pool)
    ///     .forward(Forward::to(sink).destination("events.{aggregate_type}.{event_type}"))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn forward(mut self, forward: Forward) -> Self {
        self.forward = Some(forward);
        self.forward_as = None;
        self
    }

    /// Forwards the types named with [`Forward::only`] to a broker as the subscriber `name`: one
    /// subscriber of those types among any others (see [`subscriber`](Self::subscriber)), so an
    /// event can be forwarded and handled, each with its own attempts and dead letters. While
    /// the broker is unavailable the other subscribers go on and the forwarding subscriber's
    /// copies wait, no attempt counted.
    ///
    /// ```no_run
    /// # use outbox_runtime::{sqlx, EventContext, OutboxEvent, Relay};
    /// # use serde::{Deserialize, Serialize};
    /// # #[derive(Serialize, Deserialize, OutboxEvent)]
    /// # #[outbox(aggregate = "order", event_type = "order.placed")]
    /// # struct OrderPlaced { #[outbox(id)] order_id: i64 }
    /// # async fn send_receipt(_: EventContext, _: OrderPlaced) -> Result<(), std::io::Error> { Ok(()) }
    /// # #[cfg(feature = "nats")]
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// use outbox_runtime::forward::{nats::NatsSink, Forward};
    ///
    /// let sink = NatsSink::new(async_nats::connect("127.0.0.1:4222").await?, "EVENTS");
    /// let relay = Relay::builder(pool)
    ///     .subscriber("receipts", send_receipt)
    ///     .forward_as("broker", Forward::to(sink).only([("order", "order.placed")]))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn forward_as(mut self, name: &str, forward: Forward) -> Self {
        self.forward = Some(forward);
        self.forward_as = Some(name.to_owned());
        self
    }

    /// Most deliveries running at once. Default 16, or 256 for a relay that forwards: a
    /// delivery to a broker mostly waits for its confirmation, which costs the relay nothing.
    pub fn concurrency(mut self, deliveries: usize) -> Self {
        self.concurrency = Some(deliveries);
        self
    }

    /// Most rows leased in one statement. By default the relay sizes its leases from the
    /// backlog: 100 rows while it keeps up, doubling while leases come back full, up to 1,000
    /// (a large backlog drains fastest in large leases); a relay whose handlers all take
    /// ordered events leases 100 (an ordered row waits for its predecessor, and a larger lease
    /// only reads further past the rows that wait). A fixed size turns that off.
    ///
    /// Either way a relay leases no more than its handlers, at their average duration, start
    /// within a third of the lease timeout.
    pub fn batch_size(mut self, rows: u32) -> Self {
        self.config.batch_size = Some(rows);
        self
    }

    /// Failed deliveries after which a row is dead. Default 10.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.config.max_attempts = attempts;
        self
    }

    /// Expired leases after which a row is dead. Default 30.
    ///
    /// A lease expires when its relay died, or could not renew it for a whole lease timeout
    /// (the database unreachable, the process starved or paused). That says little about the
    /// event, so expiries are counted apart from failed deliveries (in `expired_leases`, not
    /// `attempts`), against this higher limit: a healthy event does not die because relays
    /// were slow, while an event that kills every relay that delivers it (a handler that
    /// aborts the process, say) still ends as a dead letter.
    pub fn max_expired_leases(mut self, expiries: u32) -> Self {
        self.config.max_expired_leases = expiries;
        self
    }

    /// How long a lease hides a row from other relays. The relay renews the leases of rows it
    /// still holds, so this bounds how long the rows of a relay that died stay hidden, not how
    /// long a handler may run. Default 30 s.
    pub fn lease_timeout(mut self, timeout: Duration) -> Self {
        self.config.lease_timeout = timeout;
        self
    }

    /// How often an idle relay looks for rows when no notification wakes it (new events wake it
    /// at once; retries and delayed events are found by polling). Default 1 s.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// Retry delays after failures. Default: base 1 s, cap 10 minutes, jitter on.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.config.backoff = backoff;
        self
    }

    /// How long shutdown waits for running handlers before cancelling them and handing their
    /// rows back. Default 30 s.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.config.shutdown_timeout = timeout;
        self
    }

    /// Cancels a handler that runs longer than this and records a failure, so a hung handler
    /// cannot hold its row (whose lease the relay keeps renewing) forever. `None` lets
    /// handlers run as long as they like. Default 5 minutes.
    pub fn handler_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.config.handler_timeout = timeout;
        self
    }

    /// What to do with rows no handler takes. Default [`UnknownEvents::LeaveForOthers`].
    pub fn unknown_events(mut self, policy: UnknownEvents) -> Self {
        self.config.unknown_events = policy;
        self
    }

    /// What to do with rows written at a newer version than the handler's type reads.
    /// Default [`NewerVersions::LeaveForOthers`].
    pub fn newer_versions(mut self, policy: NewerVersions) -> Self {
        self.config.newer_versions = policy;
        self
    }

    /// What a dead ordered event does to the later events of its aggregate.
    /// Default [`DeadOrderedEvents::BlockAggregate`].
    pub fn dead_ordered_events(mut self, policy: DeadOrderedEvents) -> Self {
        self.config.dead_ordered_events = policy;
        self
    }

    /// Deletes published events older than `keep_for`, once a minute, in small batches (see
    /// [`purge_published`](crate::purge_published)). Running it on several relays is harmless.
    /// Default: published events are kept.
    pub fn retention(mut self, keep_for: Duration) -> Self {
        self.config.retention = Some(keep_for);
        self
    }

    /// Deletes each delivered event in the statement that acknowledges it, instead of marking it
    /// published, for applications that keep no history: the outbox then holds only pending
    /// and dead events, and nothing is left for retention to purge. Dead events are kept
    /// either way, and idempotency keys live as long as their event's row, so with this on a
    /// key can be used again once its event was delivered. Default: published events are kept.
    pub fn delete_on_publish(mut self, delete: bool) -> Self {
        self.config.on_publish = if delete { OnPublish::Delete } else { OnPublish::Mark };
        self
    }

    /// How the relay holds the rows it delivers. Default [`LeaseMode::Written`].
    ///
    /// [`LeaseMode::HeldTransaction`] locks each batch in a transaction on the relay's own
    /// connection (`FOR UPDATE SKIP LOCKED`), delivers it, and writes the outcomes in that
    /// transaction before it commits: one write per row instead of two (the lease, then the
    /// outcome), so it drains faster, most of all with
    /// [`delete_on_publish`](Self::delete_on_publish) (BENCHMARKS.md, `delete`). What it trades:
    /// - A lost connection ends the lease at once: the server releases the locks, and another
    ///   relay may deliver the batch's rows while this one's handlers still run (they are
    ///   cancelled as soon as the relay notices, within a second). A written lease outlives
    ///   its connection until its deadline. At least once holds either way.
    /// - A batch is acknowledged when its last delivery ends: a slow handler delays the others'
    ///   outcomes and the next lease, and its open transaction holds back vacuum meanwhile.
    ///   It suits fast handlers and forwarding.
    /// - A relay that dies mid-batch leaves its rows as they were: no expired lease is counted,
    ///   so [`max_expired_leases`](Self::max_expired_leases) does not apply.
    /// - Handlers that write in the acknowledgement's transaction
    ///   ([`TransactionContext`](crate::TransactionContext)) are refused by `build`
    ///   ([`BuildError::TransactionalHandler`]).
    ///
    /// The transaction is kept alive by a statement at least every second; the server ends it
    /// (`idle_in_transaction_session_timeout`, the lease timeout) if the relay stops answering.
    /// Relays of both modes can share one outbox.
    pub fn lease_mode(mut self, mode: LeaseMode) -> Self {
        self.config.lease_mode = mode;
        self
    }

    /// Checks the handlers and settings and builds the relay.
    pub fn build(self) -> Result<Relay<S>, BuildError> {
        let pool =
            self.pool.map_err(|backend| BuildError::Unsupported { backend, what: "the relay" })?;
        let mut config = self.config;
        config.concurrency = self.concurrency.unwrap_or(match self.forward {
            Some(_) => FORWARDING_CONCURRENCY,
            None => config.concurrency,
        });
        if config.concurrency == 0 {
            return Err(BuildError::InvalidSetting("concurrency must be at least 1"));
        }
        if config.batch_size == Some(0) {
            return Err(BuildError::InvalidSetting("batch_size must be at least 1"));
        }
        let positive_i32 = |n: u32, error| match i32::try_from(n) {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(BuildError::InvalidSetting(error)),
        };
        let max_attempts = |attempts| {
            positive_i32(attempts, "max_attempts must be between 1 and i32::MAX").map(|_| ())
        };
        max_attempts(config.max_attempts)?;
        let max_expired_leases = positive_i32(
            config.max_expired_leases,
            "max_expired_leases must be between 1 and i32::MAX",
        )?;
        if config.lease_timeout < Duration::from_millis(100) {
            return Err(BuildError::InvalidSetting("lease_timeout must be at least 100 ms"));
        }
        if config.poll_interval.is_zero() {
            return Err(BuildError::InvalidSetting("poll_interval must be positive"));
        }
        if self.handlers.is_empty() && self.forward.is_none() {
            return Err(BuildError::NoHandlers);
        }
        if pool.postgres().is_none() {
            let unsupported = |what| Err(BuildError::Unsupported { backend: pool.name(), what });
            if config.lease_mode == LeaseMode::HeldTransaction {
                return unsupported("`LeaseMode::HeldTransaction`");
            }
            if self.forward_as.is_some() || self.handlers.iter().any(|h| h.subscriber.is_some()) {
                return unsupported("subscribers");
            }
            if self.handlers.iter().any(|h| h.route.is_transactional()) {
                return unsupported(
                    "a handler that writes in the acknowledgement's transaction \
                     (`TransactionContext`)",
                );
            }
        }

        let mut routes: Routes<S> = HashMap::new();
        let mut subscribers: HashMap<(&'static str, &'static str), Vec<Subscribed<S>>> =
            HashMap::new();
        // Every type handled, by a handler or by subscribers (the first one's event type).
        let mut handled: HashMap<(&str, &str), (&'static EventType, &'static str)> = HashMap::new();
        for handler in self.handlers {
            if config.lease_mode == LeaseMode::HeldTransaction && handler.route.is_transactional() {
                return Err(BuildError::TransactionalHandler { handler: handler.event_name });
            }
            if config.lease_mode == LeaseMode::HeldTransaction && handler.subscriber.is_some() {
                return Err(BuildError::InvalidSetting(
                    "subscribers need `LeaseMode::Written` (the default)",
                ));
            }
            if let Some(name) = &handler.subscriber {
                if !is_valid_name(name) {
                    return Err(BuildError::InvalidSubscriberName { name: name.clone() });
                }
            }
            let policy = handler.options.over(&config);
            max_attempts(policy.max_attempts)?;
            let route = Routed { route: Arc::from(handler.route), policy };
            for event_type in handler.event_types {
                let key = (handler.aggregate_type, event_type.name());
                let both = || BuildError::HandledAndSubscribed {
                    aggregate_type: key.0,
                    event_type: key.1,
                };
                let Some(name) = &handler.subscriber else {
                    if let Some((_, first)) = handled.insert(key, (event_type, handler.event_name))
                    {
                        if subscribers.contains_key(&key) {
                            return Err(both());
                        }
                        return Err(BuildError::DuplicateHandler {
                            aggregate_type: handler.aggregate_type,
                            event_type: event_type.name(),
                            first,
                            second: handler.event_name,
                        });
                    }
                    routes.insert(key, route.clone());
                    continue;
                };
                if routes.contains_key(&key) {
                    return Err(both());
                }
                let of_type = subscribers.entry(key).or_default();
                if of_type.iter().any(|other| *other.name == **name) {
                    return Err(BuildError::DuplicateSubscriber {
                        subscriber: name.clone(),
                        aggregate_type: key.0.to_owned(),
                        event_type: key.1.to_owned(),
                    });
                }
                of_type.push(Subscribed {
                    name: Arc::from(name.as_str()),
                    routed: route.clone(),
                    newest: event_type.version(),
                });
                handled.entry(key).or_insert((event_type, handler.event_name));
            }
        }
        let upcasters = json_upcasters(self.upcasters, &handled)?;
        let newest_read = handled
            .iter()
            .map(|(&(a, e), &(event_type, _))| ((a.to_owned(), e.to_owned()), event_type.version()))
            .collect();

        // The sink takes every leased row no handler takes: with `Forward::only`, the relay
        // leases just the handled and the forwarded types; without, it leases every type.
        let forwarding = self
            .forward
            .as_ref()
            .map(|forward| Forwarding { sink: forward.sink.clone(), health: SinkHealth::new() });
        let forwarded = self.forward.as_ref().map(|forward| forward.event_types.clone());
        let mut forwarder = None;
        let fallback = match self.forward.zip(forwarding.as_ref()) {
            Some((forward, forwarding)) => {
                let destination =
                    forward.destination.clone().map_err(BuildError::InvalidDestination)?;
                let route = ForwardRoute::new(forward, destination, forwarding.health.clone());
                let route = Arc::new(route) as Arc<dyn Route<S>>;
                let routed = Routed { route, policy: config.policy() };
                match self.forward_as {
                    Some(name) => {
                        forwarder = Some((name, routed));
                        None
                    }
                    None => Some(routed),
                }
            }
            None => None,
        };
        // Every subscriber by type: the typed ones, then (below) the forwarding one of each type
        // it forwards, which forwards any version as stored.
        let mut by_type: HashMap<String, HashMap<String, Vec<Subscribed<S>>>> = HashMap::new();
        for ((aggregate_type, event_type), of_type) in subscribers {
            let of_aggregate = by_type.entry(aggregate_type.to_owned()).or_default();
            of_aggregate.insert(event_type.to_owned(), of_type);
        }
        // Rows newer than a handler reads stay for newer relays, unless they are to fail.
        let newest = |version: u32| match config.newer_versions {
            NewerVersions::LeaveForOthers => i32::try_from(version).unwrap_or(i32::MAX),
            NewerVersions::Fail => i32::MAX,
        };
        let mut types = TypeVersions::default();
        for (&(aggregate_type, name), &(event_type, _)) in &handled {
            match by_type.get(aggregate_type).and_then(|of| of.get(name)) {
                None => types.push(aggregate_type, name, "", newest(event_type.version())),
                Some(of_type) => {
                    // An event is delivered to every subscriber here at once: one that reads
                    // an older version leaves it for a relay that all of its subscribers read.
                    let oldest = of_type.iter().map(|s| s.newest).min().unwrap_or(1);
                    types.push(aggregate_type, name, "", newest(oldest));
                    for subscriber in of_type {
                        types.push(
                            aggregate_type,
                            name,
                            &subscriber.name,
                            newest(subscriber.newest),
                        );
                    }
                }
            }
        }
        // While the sink is unavailable a relay that also handles events leases only those.
        let handled_types = (!types.event_types.is_empty()).then(|| types.clone());
        // The forwarding subscriber's leases come after: it waits while the sink is away.
        let mut forwarded_as = Vec::new();
        if let Some((name, routed)) = forwarder {
            let Some(Some(forwarded_types)) = &forwarded else {
                return Err(BuildError::InvalidSetting(
                    "`forward_as` forwards the types named with `Forward::only`",
                ));
            };
            if !is_valid_name(&name) {
                return Err(BuildError::InvalidSubscriberName { name });
            }
            let name: Arc<str> = Arc::from(name.as_str());
            for (aggregate_type, event_type) in forwarded_types {
                let key = (aggregate_type.as_str(), event_type.as_str());
                if let (Some(&(_, handler)), true) = (handled.get(&key), routes.contains_key(&key))
                {
                    return Err(BuildError::ForwardedAndHandled {
                        aggregate_type: aggregate_type.clone(),
                        event_type: event_type.clone(),
                        handler,
                    });
                }
                let of_type = by_type
                    .entry(aggregate_type.clone())
                    .or_default()
                    .entry(event_type.clone())
                    .or_default();
                if of_type.iter().any(|other| other.name == name) {
                    return Err(BuildError::DuplicateSubscriber {
                        subscriber: name.to_string(),
                        aggregate_type: aggregate_type.clone(),
                        event_type: event_type.clone(),
                    });
                }
                // Its own copies and, for a type it alone takes here, the events.
                if of_type.is_empty() {
                    forwarded_as.push((aggregate_type, event_type, None));
                }
                forwarded_as.push((aggregate_type, event_type, Some(name.clone())));
                let routed = routed.clone();
                of_type.push(Subscribed { name: name.clone(), routed, newest: u32::MAX });
            }
        }
        for (aggregate_type, event_type, subscriber) in forwarded_as {
            types.push(aggregate_type, event_type, subscriber.as_deref().unwrap_or(""), i32::MAX);
        }
        let forwarded_by_fallback = fallback.as_ref().and(forwarded.clone()).flatten();
        for (aggregate_type, event_type) in forwarded_by_fallback.unwrap_or_default() {
            if let Some(&(_, first)) = handled.get(&(aggregate_type.as_str(), event_type.as_str()))
            {
                return Err(BuildError::ForwardedAndHandled {
                    aggregate_type,
                    event_type,
                    handler: first,
                });
            }
            // A forwarded payload goes out as stored, whatever its version.
            types.push(&aggregate_type, &event_type, "", i32::MAX);
        }

        // Ordered rows become leasable one per aggregate, as their predecessors are published,
        // and a lease reads past every row that waits: one asking for more rows than are
        // leasable reads the whole backlog (BENCHMARKS.md, "Ordered backlogs"). So a relay that
        // leases only ordered types keeps its leases at the smallest adaptive size.
        let only_ordered = forwarded.is_none()
            && config.unknown_events != UnknownEvents::Fail
            && handled.values().all(|(event_type, _)| event_type.ordered());
        if only_ordered && config.batch_size.is_none() {
            config.batch_size = Some(ORDERED_BATCH_SIZE);
        }

        // Decided once here, not in the loop: which rows every lease asks for, and which
        // wake-ups a sleeping relay wants.
        let every_type =
            matches!(forwarded, Some(None)) || config.unknown_events == UnknownEvents::Fail;
        let (types, wakes_for) = if every_type {
            (LeaseTypes::All(types), None)
        } else {
            let wakes_for = types.event_types.clone();
            (LeaseTypes::Only(types), Some(wakes_for))
        };
        let lease_plan = |types| LeasePlan {
            types,
            lease_timeout: config.lease_timeout,
            max_expired_leases,
            skip_dead_ordered: config.dead_ordered_events == DeadOrderedEvents::SkipPast,
        };
        let plan = Plan {
            lease: lease_plan(types),
            while_sink_down: forwarding
                .as_ref()
                .and(handled_types)
                .map(|types| lease_plan(LeaseTypes::Only(types))),
            wakes_for,
        };
        let metrics = RelayMetrics::new(forwarding.as_ref().map(|f| f.health.clone()));
        let type_name =
            |(aggregate_type, event_type): (&str, &str)| format!("{aggregate_type}/{event_type}");
        let mut handles: Vec<String> = handled.keys().map(|&key| type_name(key)).collect();
        handles.sort();
        let registration = Registration {
            lease_mode: match config.lease_mode {
                LeaseMode::Written => "written",
                LeaseMode::HeldTransaction => "held_transaction",
            },
            handles,
            forwards: forwarded.map(|types| match types {
                None => vec!["*".to_owned()],
                Some(types) => {
                    types.iter().map(|(a, e)| type_name((a.as_str(), e.as_str()))).collect()
                }
            }),
        };
        Ok(Relay {
            pool,
            state: self.state,
            routes,
            newest_read,
            upcasters: Arc::new(upcasters),
            fallback,
            forwarding,
            config: Arc::new(config),
            plan,
            metrics,
            registration,
            held_rows: HeldRows::default(),
            subscribers: Subscribers::new(by_type),
        })
    }
}

#[cfg(feature = "testing")]
impl<S> RelayBuilder<S> {
    /// For `testing::drain`: test speeds for the poll interval and the backoff, where the caller
    /// left them at their defaults (one who set a default explicitly gets the test value too).
    pub(crate) fn or_test_speeds(mut self, poll_interval: Duration, backoff: Backoff) -> Self {
        let defaults = RelayConfig::default();
        if self.config.poll_interval == defaults.poll_interval {
            self.config.poll_interval = poll_interval;
        }
        if self.config.backoff == defaults.backoff {
            self.config.backoff = backoff;
        }
        self
    }
}

/// Whether `name` follows the grammar of the derive's names (`outbox-macros/src/name.rs`).
fn is_valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= 128
        && chars.next().is_some_and(|first| first.is_ascii_lowercase())
        && chars
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-'))
}

/// The JSON upcasters by the version they read, each checked to run for some handler: one per
/// version, below the oldest version the handler's type reads, and reaching it without a gap.
pub(crate) fn json_upcasters(
    registered: Vec<Upcaster>,
    handled: &HashMap<(&str, &str), (&'static EventType, &'static str)>,
) -> Result<JsonUpcasters, BuildError> {
    let mut upcasters = JsonUpcasters::default();
    let mut checks = Vec::new();
    for Upcaster { aggregate_type, event_type, from_version, upcaster } in registered {
        let invalid = |reason: String| BuildError::InvalidUpcaster {
            aggregate_type,
            event_type: event_type.clone(),
            from_version,
            reason,
        };
        let Some(&(known, handler)) = handled.get(&(aggregate_type, event_type.as_str())) else {
            return Err(invalid("no handler takes this event type".into()));
        };
        if from_version >= known.oldest_version() || from_version == 0 {
            return Err(invalid(format!(
                "`{handler}` reads versions {} to {} itself; upcasters read older ones, from 1",
                known.oldest_version(),
                known.version()
            )));
        }
        let key = (aggregate_type, known.name(), from_version);
        if upcasters.0.insert(key, upcaster).is_some() {
            return Err(invalid("registered twice".into()));
        }
        checks.push((key, known));
    }
    for ((aggregate_type, event_type, from_version), known) in checks {
        if let Some(missing) = (from_version..known.oldest_version())
            .find(|&version| !upcasters.0.contains_key(&(aggregate_type, event_type, version)))
        {
            return Err(BuildError::InvalidUpcaster {
                aggregate_type,
                event_type: event_type.to_owned(),
                from_version,
                reason: format!(
                    "it cannot reach version {}, which the handler's type reads: version \
                     {missing} has no upcaster",
                    known.oldest_version()
                ),
            });
        }
    }
    Ok(upcasters)
}
