//! The relay: leases committed events, hands each to its typed handler, records the outcome.
//!
//! The walk of a leased row, file by file:
//! - `work.rs`: the loop leases a batch (`store::lease`, under a fresh fencing token) with the
//!   plan decided in `builder.rs`, sized by `pace.rs`, starting where `cursor.rs` says (past the
//!   rows leased last while draining a backlog); `held.rs` records each row's lease and
//!   its deadline, and the row is queued as a `Delivery`.
//! - `deliver.rs`: when a handler slot is free the delivery starts, if its lease is still valid;
//!   `crate::decode` reads the payload as the handler's type from its stored version (JSON
//!   upcasters, then the type's `upcast_from` chain), `handler.rs` (or `transactional.rs`
//!   for a handler that writes in the acknowledgement's transaction) calls the handler, and the
//!   delivery is cancelled if its lease's deadline passes first; `outcome.rs` reads what a
//!   handler's error asked for (retry, reject, snooze).
//! - `acker.rs`: the outcome (`Ack`) is written with the row's current token from `held.rs`, in
//!   a batch with one statement per kind (`store::publish`, `fail`, `release`, `snooze`), and
//!   the row is settled (leaves `held.rs`); beside it, `renewals.rs` renews every held lease.
//! - `held_transaction.rs`: the other lease mode, `LeaseMode::HeldTransaction`: each batch is
//!   locked in a transaction of the relay's own (`store::hold`), delivered as above, and its
//!   outcomes written in that transaction; no acknowledger, no renewals.
//! - Around them: `connections.rs` (the relay's own connections, checked at start to keep their
//!   sessions), `idle.rs` and `listener.rs` (waiting for work), `config.rs` (settings),
//!   `metrics.rs` (counts), `context.rs` (what a handler sees).
//!
//! The relay runs on any backend: it holds the database as a `store::Db`, one backend's pool,
//! and every statement above goes through it to that backend's SQL. What only PostgreSQL has
//! (LISTEN/NOTIFY, the sleepers' registrations, the relays' registry, subscribers, held
//! transactions, the gauges) is reached through `Db::postgres`, and `build` refuses the rest
//! elsewhere.

mod acker;
mod builder;
mod config;
mod connections;
mod context;
mod cursor;
mod deliver;
mod fan_out;
mod forwarding;
mod handler;
mod held;
mod held_transaction;
mod idle;
mod listener;
mod metrics;
mod outcome;
mod pace;
mod registry;
mod renewals;
mod transactional;
mod work;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

use crate::decode::JsonUpcasters;
use crate::error::{Error, ErrorChain};
use crate::forward;
use crate::store::{Db, LeasePlan, LeasedEvent};
use acker::{Ack, Acker};
use config::{Policy, RelayConfig};
use connections::Connections;
use deliver::{Delivery, Target};
use forwarding::Forwarding;
use held::{Held, HeldLease, HeldRows};
use pace::Pace;
use registry::Registration;
use work::Work;

pub(crate) use builder::{json_upcasters, Upcaster};
pub use builder::{BuildError, RelayBuilder};
pub use config::{
    Backoff, DeadOrderedEvents, HandlerOptions, LeaseMode, NewerVersions, UnknownEvents,
};
pub use context::EventContext;
pub(crate) use context::RowMeta;
pub(crate) use deliver::panic_text;
pub(crate) use handler::Route;
pub use handler::{Handler, HandlerContext};
pub use metrics::{RelayCounts, RelayMetrics};
pub(crate) use outcome::Verdict;
pub use outcome::{Reject, Snooze};
pub use transactional::TransactionContext;

/// How long shutdown gives the last acknowledgements once its deadline passed: those of the
/// handlers that finished at the deadline, written in one batch.
const LAST_ACKS_GRACE: Duration = Duration::from_secs(1);

type Routes<S> = HashMap<(&'static str, &'static str), Routed<S>>;

/// A route, and how its deliveries are timed out and retried.
#[derive(Clone)]
struct Routed<S> {
    route: Arc<dyn Route<S>>,
    policy: Policy,
}

/// The subscribers of each event type that has them, by aggregate type, then event type.
struct Subscribers<S>(HashMap<String, OfAggregate<S>>);

/// The subscribers of one aggregate's event types, by event type.
type OfAggregate<S> = HashMap<String, Arc<[Subscribed<S>]>>;

impl<S> Subscribers<S> {
    fn new(by_type: HashMap<String, HashMap<String, Vec<Subscribed<S>>>>) -> Self {
        let by_type = by_type.into_iter().map(|(aggregate_type, of_aggregate)| {
            let of_aggregate = of_aggregate.into_iter().map(|(e, of)| (e, Arc::from(of)));
            (aggregate_type, of_aggregate.collect())
        });
        Subscribers(by_type.collect())
    }

    /// The subscribers of a type, if it has any.
    fn of(&self, aggregate_type: &str, event_type: &str) -> Option<&Arc<[Subscribed<S>]>> {
        self.0.get(aggregate_type)?.get(event_type)
    }

    /// Every `(aggregate_type, event_type, subscriber)`.
    fn iter(&self) -> impl Iterator<Item = (&str, &str, &Subscribed<S>)> {
        self.0.iter().flat_map(|(aggregate_type, of_aggregate)| {
            of_aggregate.iter().flat_map(move |(event_type, of_type)| {
                of_type.iter().map(move |s| (aggregate_type.as_str(), event_type.as_str(), s))
            })
        })
    }
}

/// One subscriber of an event type, as this relay runs it.
struct Subscribed<S> {
    name: Arc<str>,
    routed: Routed<S>,
    /// The newest version of the type its handler reads.
    newest: u32,
}

/// Delivers committed outbox events to typed handlers, at least once each.
///
/// Build one with [`Relay::builder`], then [`run_until`](Relay::run_until) a shutdown signal.
/// Any number of relays, in one process or many, can share one outbox table: a leased row is
/// hidden from the others until its lease is acknowledged or expires.
pub struct Relay<S = ()> {
    pool: Db,
    state: S,
    routes: Routes<S>,
    /// The newest version each handler reads, by `(aggregate_type, event_type)`.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    newest_read: HashMap<(String, String), u32>,
    /// JSON upcasters for versions older than the handlers' types read.
    upcasters: Arc<JsonUpcasters>,
    /// Where rows go that no handler takes, when the relay forwards every other type.
    fallback: Option<Routed<S>>,
    /// The sink the relay forwards to, if it forwards.
    forwarding: Option<Forwarding>,
    /// Every setting, owned here; the tasks of a run share it.
    config: Arc<RelayConfig>,
    plan: Plan,
    metrics: RelayMetrics,
    /// What its entry in `outbox.relays` says of it.
    registration: Registration,
    /// Rows it holds leases on, for that entry.
    held_rows: HeldRows,
    /// The subscribers it runs, by event type (types with subscribers have no route).
    subscribers: Subscribers<S>,
}

/// What a relay decided once, when it was built, from its handlers and settings.
struct Plan {
    /// What every lease asks for: which types, how long, the limits.
    lease: LeasePlan,
    /// What leases ask for while the sink is unavailable: the handled types only; `None` when
    /// the relay only forwards (it then leases nothing until the sink answers).
    while_sink_down: Option<LeasePlan>,
    /// The event types a sleeping relay waits for; `None` for all.
    wakes_for: Option<Vec<String>>,
}

impl<S: Clone + Send + Sync + 'static> Relay<S> {
    /// A live view of this relay's counters, usable while it runs.
    pub fn metrics(&self) -> RelayMetrics {
        self.metrics.clone()
    }

    /// Runs the relay until `shutdown` completes, then shuts down gracefully: stops leasing,
    /// hands back rows it leased but did not start, waits up to the shutdown timeout for running
    /// handlers (cancelling and handing back the rest) and their acknowledgements, and returns
    /// what it did. Shutdown takes at most the shutdown timeout and a second; nothing of the
    /// relay's (a publish to a broker among them) runs after it returns.
    ///
    /// Database errors are logged and retried, never fatal, except a missing outbox schema.
    /// Before anything else it checks that its connections keep their session: through a pooler
    /// in transaction mode it returns [`Error::TransactionPooling`] without leasing anything.
    /// Then it checks the schema's migrations ([`check_schema`](crate::check_schema)): a schema
    /// lacking some of this version's is [`Error::SchemaOutdated`], returned at once.
    ///
    /// ```no_run
    /// # async fn run(relay: outbox_runtime::Relay) -> Result<(), outbox_runtime::Error> {
    /// let counts = relay.run_until(async { tokio::signal::ctrl_c().await.ok(); }).await?;
    /// println!("delivered {} events", counts.delivered);
    /// # Ok(()) }
    /// ```
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> Result<RelayCounts, Error> {
        let config = &self.config;
        if let Some(forwarding) = &self.forwarding {
            forwarding.sink.check().await.map_err(Error::Sink)?;
        }
        // When shutdown began: the relay's entry is withdrawn within the same bound as the rest.
        let shutdown_at = OnceLock::new();
        let shutdown = async {
            shutdown.await;
            let _ = shutdown_at.set(Instant::now());
        };
        // Nothing runs on the relay's connections before they are known to keep their session.
        let mut shutdown = std::pin::pin!(shutdown);
        tokio::select! {
            checked = connections::check_sessions(&self.pool) => checked?,
            () = &mut shutdown => return Ok(self.metrics.counts()),
        }
        let connections = Connections::open(&self.pool, config.lease_mode, config.lease_timeout);
        // On the relay's own connections: the application's pool may be busy, or exhausted.
        tokio::select! {
            checked = crate::migrate::await_schema(&connections.relay) => checked?,
            () = &mut shutdown => return Ok(self.metrics.counts()),
        }
        // Before the first lease: an event's acknowledgement copies it for registered subscribers.
        tokio::select! {
            () = fan_out::register(&connections.relay, &self.subscribers) => {}
            () = &mut shutdown => return Ok(self.metrics.counts()),
        }
        let wake = Arc::new(Notify::new());
        // Background tasks die with this future, should the caller drop it instead of
        // signalling shutdown; leased rows then come back when their leases expire.
        let listener = connections.listen.clone().zip(connections.relay.postgres().cloned()).map(
            |(listen, notifier)| {
                let listening =
                    listener::listen(listen, notifier, wake.clone(), config.poll_interval);
                AbortOnDrop::spawn(listening)
            },
        );
        let chores = self.chores(&connections.relay, &wake);
        let (stop_heartbeat, heartbeat_stop) = oneshot::channel();
        let mut registered = AbortOnDrop::spawn(registry::keep_registered(
            connections.relay.clone(),
            self.registration.clone(),
            self.held_rows.clone(),
            self.metrics.clone(),
            heartbeat_stop,
        ));

        self.metrics.set_running(true);
        let result = match config.lease_mode {
            LeaseMode::Written => self.run_written(&connections, &wake, shutdown).await,
            LeaseMode::HeldTransaction => {
                held_transaction::run(&self, &connections, &wake, shutdown).await
            }
        };
        drop((listener, chores));
        // The relay's entry goes last, once it holds nothing; past the shutdown's bound it is
        // left, and shows as silent.
        drop(stop_heartbeat);
        let began = shutdown_at.get().copied().unwrap_or_else(Instant::now);
        let withdrawn_by = began + config.shutdown_timeout + LAST_ACKS_GRACE;
        let _ = tokio::time::timeout_at(withdrawn_by, &mut registered.0).await;
        connections.close().await;
        self.metrics.set_running(false);
        result.map(|()| self.metrics.counts())
    }

    /// The written lease mode: the work loop leases, the acknowledger writes the outcomes, the
    /// renewals keep the leases; then the graceful shutdown of all three.
    async fn run_written(
        &self,
        connections: &Connections,
        wake: &Notify,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Error> {
        let config = &self.config;
        let held = Held::new(&self.held_rows);
        let (acks, acks_rx) = mpsc::unbounded_channel();
        let mut acker = AbortOnDrop::spawn(
            Acker {
                pool: connections.relay.clone(),
                held: held.clone(),
                metrics: self.metrics.clone(),
                config: self.config.clone(),
            }
            .run(acks_rx),
        );
        // Until the last acknowledgement is written: rows wait for theirs under a valid lease.
        let renewals = AbortOnDrop::spawn(renewals::renew_periodically(
            held.clone(),
            connections.relay.clone(),
            config.lease_timeout,
        ));
        let mut work = Work::new(held, acks, config.batch_size);
        let result = work.run(self, connections, wake, shutdown).await;
        // One deadline for the handlers still running and the acknowledgements after them.
        let deadline = Instant::now() + config.shutdown_timeout;
        work.shut_down(deadline).await;
        // With the database away the last acknowledgements could retry for a lease timeout;
        // shutdown gives up at the deadline (or a moment after it, for the acknowledgements of
        // handlers that finished at the deadline), and those rows are delivered again after
        // their leases.
        let acks_until = deadline.max(Instant::now() + LAST_ACKS_GRACE);
        match tokio::time::timeout_at(acks_until, &mut acker.0).await {
            Ok(Err(error)) => {
                tracing::error!(error = %ErrorChain(&error), "outbox acknowledger failed")
            }
            Err(_) => tracing::warn!("outbox acknowledgements unfinished at the shutdown timeout"),
            Ok(Ok(())) => {}
        }
        drop(renewals);
        result
    }

    /// The tasks beside the work: retention, if set, the metrics gauges, and the sink's probe.
    fn chores(&self, pool: &Db, wake: &Arc<Notify>) -> Vec<AbortOnDrop<()>> {
        let mut chores = Vec::new();
        if let Some(Forwarding { sink, health }) = &self.forwarding {
            let probe = forward::probe(sink.clone(), health.clone(), wake.clone());
            chores.push(AbortOnDrop::spawn(probe));
        }
        if let Some(keep_for) = self.config.retention {
            let purge = crate::retention::purge_periodically(pool.clone(), keep_for);
            chores.push(AbortOnDrop::spawn(purge));
        }
        // The table-wide gauges are PostgreSQL's so far.
        #[cfg(feature = "metrics")]
        if let Some(pool) = pool.postgres() {
            let newest_read = self.newest_read.clone();
            chores.push(AbortOnDrop::spawn(metrics::refresh_gauges(pool.clone(), newest_read)));
        }
        chores
    }

    /// Whom a leased row goes to: a copy to its subscriber, an event of a type with subscribers
    /// to those this relay runs, any other to its handler, else to the forwarding route; to no
    /// route when none takes its type (the `UnknownEvents::Fail` policy leases those too), and
    /// then with the relay's policy.
    fn target(&self, row: &LeasedEvent) -> Target<S> {
        let key = (row.aggregate_type.as_str(), row.event_type.as_str());
        let routed = match self.subscribers.of(key.0, key.1) {
            Some(subscribers) if row.subscriber.is_empty() => {
                return Target::Subscribers(subscribers.clone());
            }
            Some(subscribers) => {
                subscribers.iter().find(|s| *s.name == row.subscriber).map(|s| &s.routed)
            }
            None => self.routes.get(&key).or(self.fallback.as_ref()),
        };
        match routed {
            Some(Routed { route, policy }) => {
                Target::One { route: Some(route.clone()), policy: *policy }
            }
            None => Target::One { route: None, policy: self.config.policy() },
        }
    }

    /// The delivery of a leased row, under `lease`; its outcome goes to `acks`.
    fn delivery(
        &self,
        row: LeasedEvent,
        lease: HeldLease,
        acks: &mpsc::UnboundedSender<Ack>,
        pace: &Pace,
    ) -> Delivery<S> {
        Delivery {
            target: self.target(&row),
            upcasters: self.upcasters.clone(),
            state: self.state.clone(),
            row,
            lease,
            pool: self.pool.clone(),
            config: self.config.clone(),
            acks: acks.clone(),
            metrics: self.metrics.clone(),
            pace: pace.clone(),
        }
    }
}

impl<S> Relay<S> {
    /// The plan to lease with now, and whether it is the one for while the sink is down; or,
    /// for a relay that only forwards while its sink is away, the sink's health to wait on.
    fn lease_plan_now(&self) -> Result<(&LeasePlan, bool), &forward::SinkHealth> {
        let sink_down = self.forwarding.as_ref().filter(|f| !f.health.is_available());
        match (sink_down, &self.plan.while_sink_down) {
            (None, _) => Ok((&self.plan.lease, false)),
            (Some(_), Some(handled_only)) => Ok((handled_only, true)),
            (Some(forwarding), None) => Err(&forwarding.health),
        }
    }
}

/// What `testing::drain` reads to tell when the relay has nothing left to deliver soon.
#[cfg(feature = "testing")]
impl<S> Relay<S> {
    pub(crate) fn pool(&self) -> &Db {
        &self.pool
    }

    pub(crate) fn lease_plan(&self) -> &LeasePlan {
        &self.plan.lease
    }
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T: Send + 'static> AbortOnDrop<T> {
    fn spawn(task: impl Future<Output = T> + Send + 'static) -> Self {
        AbortOnDrop(tokio::spawn(task))
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
