//! Assembling a relay: state, handlers, settings; conflicts are found by `build`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::event::OutboxEvent;
use crate::forward::{Forward, ForwardRoute};
use crate::relay::config::{Backoff, DeadOrderedEvents, RelayConfig, UnknownEvents};
use crate::relay::handler::{Handler, Route, Stateless};
use crate::relay::metrics::RelayMetrics;
use crate::relay::{Plan, Relay, Routes};
use crate::store::{LeasePlan, LeaseTypes};

/// The default concurrency of a relay that forwards to a broker.
const FORWARDING_CONCURRENCY: usize = 256;

/// Builds a [`Relay`]; start with [`Relay::builder`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct RelayBuilder<S = ()> {
    pool: PgPool,
    state: S,
    handlers: Vec<Registered<S>>,
    forward: Option<Forward>,
    /// Set by [`RelayBuilder::concurrency`]; the default depends on forwarding.
    concurrency: Option<usize>,
    config: RelayConfig,
}

struct Registered<S> {
    aggregate_type: &'static str,
    event_type: &'static str,
    event_name: &'static str,
    route: Box<dyn Route<S>>,
}

/// Why [`RelayBuilder::build`] refused to build a relay.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum BuildError {
    /// Two handlers were registered for one `(aggregate_type, event_type)`.
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
    /// A setting is out of range.
    #[error("invalid relay setting: {0}")]
    InvalidSetting(&'static str),
}

impl Relay<()> {
    /// Starts building a relay that leases from the outbox through `pool`.
    ///
    /// Handlers are free to use `pool` (transactional handlers do). The relay's own statements
    /// run on up to six connections it opens with the pool's connect options: one to lease, up
    /// to four to acknowledge and renew, for retention and gauges, and to register for
    /// wake-ups, and one to LISTEN for new events.
    pub fn builder(pool: PgPool) -> RelayBuilder<()> {
        RelayBuilder {
            pool,
            state: (),
            handlers: Vec::new(),
            forward: None,
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
                aggregate_type: h.aggregate_type,
                event_type: h.event_type,
                event_name: h.event_name,
                route: Box::new(Stateless(h.route)) as Box<dyn Route<S>>,
            })
            .collect();
        RelayBuilder {
            pool: self.pool,
            state,
            handlers,
            forward: self.forward,
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
    /// # use outbox_runtime::{EventContext, OutboxEvent, Relay};
    /// # use serde::{Deserialize, Serialize};
    /// # #[derive(Serialize, Deserialize, OutboxEvent)]
    /// # #[outbox(aggregate = "order", event_type = "order.placed")]
    /// # struct OrderPlaced { #[outbox(id)] order_id: i64 }
    /// async fn on_placed(ctx: EventContext, event: OrderPlaced) -> Result<(), std::io::Error> {
    ///     println!("order {} placed (attempt {})", event.order_id, ctx.attempt());
    ///     Ok(())
    /// }
    /// # fn build(pool: sqlx::PgPool) -> Result<(), outbox_runtime::BuildError> {
    /// let relay = Relay::builder(pool).handler(on_placed).build()?;
    /// # Ok(()) }
    /// ```
    pub fn handler<M, H: Handler<M, S>>(self, handler: H) -> Self {
        self.route::<H::Event>(handler.into_route().0)
    }

    fn route<E: OutboxEvent>(mut self, route: Box<dyn Route<S>>) -> Self {
        self.handlers.push(Registered {
            aggregate_type: E::AGGREGATE_TYPE,
            event_type: E::EVENT_TYPE,
            event_name: std::any::type_name::<E>(),
            route,
        });
        self
    }

    /// Forwards events to a broker (see [`forward`](crate::forward)): every type no handler
    /// takes, or the types named with [`Forward::only`]. A row is published once the broker
    /// confirmed its message; a refusal is a failed delivery, retried with backoff and dead
    /// after `max_attempts`. The sink is checked when the relay starts.
    ///
    /// ```no_run
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
        self
    }

    /// Most deliveries running at once. Default 16, or 256 for a relay that forwards: a
    /// delivery to a broker mostly waits for its confirmation, which costs the relay nothing.
    pub fn concurrency(mut self, deliveries: usize) -> Self {
        self.concurrency = Some(deliveries);
        self
    }

    /// Most rows leased in one statement. Default 100.
    pub fn batch_size(mut self, rows: u32) -> Self {
        self.config.batch_size = rows;
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

    /// Checks the handlers and settings and builds the relay.
    pub fn build(self) -> Result<Relay<S>, BuildError> {
        let mut config = self.config;
        config.concurrency = self.concurrency.unwrap_or(match self.forward {
            Some(_) => FORWARDING_CONCURRENCY,
            None => config.concurrency,
        });
        if config.concurrency == 0 {
            return Err(BuildError::InvalidSetting("concurrency must be at least 1"));
        }
        if config.batch_size == 0 {
            return Err(BuildError::InvalidSetting("batch_size must be at least 1"));
        }
        let positive_i32 = |n: u32, error| match i32::try_from(n) {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(BuildError::InvalidSetting(error)),
        };
        let max_attempts =
            positive_i32(config.max_attempts, "max_attempts must be between 1 and i32::MAX")?;
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

        let mut routes: Routes<S> = HashMap::new();
        let mut names: HashMap<(&str, &str), &'static str> = HashMap::new();
        for handler in self.handlers {
            let key = (handler.aggregate_type, handler.event_type);
            if let Some(first) = names.insert(key, handler.event_name) {
                return Err(BuildError::DuplicateHandler {
                    aggregate_type: handler.aggregate_type,
                    event_type: handler.event_type,
                    first,
                    second: handler.event_name,
                });
            }
            routes.insert(key, Arc::from(handler.route));
        }

        // The sink takes every leased row no handler takes: with `Forward::only`, the relay
        // leases just the handled and the forwarded types; without, it leases every type.
        let sink = self.forward.as_ref().map(|forward| forward.sink.clone());
        let forwarded = self.forward.as_ref().map(|forward| forward.event_types.clone());
        let fallback = self.forward.map(|forward| {
            let route: Arc<dyn Route<S>> = Arc::new(ForwardRoute::new(forward));
            route
        });
        let mut pairs: Vec<(String, String)> =
            routes.keys().map(|&(a, e)| (a.to_owned(), e.to_owned())).collect();
        for (aggregate_type, event_type) in forwarded.clone().flatten().unwrap_or_default() {
            if let Some(&first) = names.get(&(aggregate_type.as_str(), event_type.as_str())) {
                return Err(BuildError::ForwardedAndHandled {
                    aggregate_type,
                    event_type,
                    handler: first,
                });
            }
            pairs.push((aggregate_type, event_type));
        }

        // Decided once here, not in the loop: which rows every lease asks for, and which
        // wake-ups a sleeping relay wants.
        let every_type =
            matches!(forwarded, Some(None)) || config.unknown_events == UnknownEvents::Fail;
        let (types, wakes_for) = if every_type {
            (LeaseTypes::All, None)
        } else {
            let (aggregate_types, event_types): (Vec<String>, Vec<String>) =
                pairs.into_iter().unzip();
            let wakes_for = Some(event_types.clone());
            (LeaseTypes::Only { aggregate_types, event_types }, wakes_for)
        };
        let plan = Plan {
            lease: LeasePlan {
                types,
                lease_timeout: config.lease_timeout,
                max_expired_leases,
                skip_dead_ordered: config.dead_ordered_events == DeadOrderedEvents::SkipPast,
            },
            wakes_for,
            max_attempts,
        };
        Ok(Relay {
            pool: self.pool,
            state: self.state,
            routes,
            fallback,
            sink,
            config,
            plan,
            metrics: RelayMetrics::default(),
        })
    }
}
