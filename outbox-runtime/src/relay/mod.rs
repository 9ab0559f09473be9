//! The relay: leases committed events, hands each to its typed handler, records the outcome.
//!
//! Inside, one loop leases batches and spawns a task per delivery (at most `concurrency` at
//! once); deliveries send their outcomes to an acknowledger that writes them in batches; a
//! listener wakes the loop on NOTIFY; between writes, the acknowledger renews the leases of
//! held rows.

mod acker;
mod builder;
mod config;
mod context;
mod decode;
mod deliver;
mod handler;
mod held;
mod idle;
mod listener;
mod metrics;
mod pace;
mod transactional;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;

use crate::error::Error;
use crate::store::{self, LeaseFilter, LeaseRequest, LeasedEvent};
use acker::Acker;
use config::RelayConfig;
use deliver::Delivery;
use handler::Route;
use held::{Held, HeldLease};
use idle::Idle;
use pace::Pace;

pub use builder::{BuildError, RelayBuilder};
pub use config::{Backoff, DeadOrderedEvents, UnknownEvents};
pub use context::EventContext;
pub use handler::{Handler, HandlerContext};
pub use metrics::{RelayCounts, RelayMetrics};
pub use transactional::TransactionContext;

/// Most finished deliveries waiting for their acknowledgement before the relay stops leasing:
/// when acknowledgements lag, the relay does not take more rows than it can acknowledge.
const MAX_UNACKNOWLEDGED: usize = 1_000;

/// How soon a failed lease is tried again, doubling up to 30 s while it keeps failing. Soon:
/// the usual failure is one broken pooled connection (after a database restart, say), which
/// the failure itself discarded.
const FIRST_LEASE_RETRY: Duration = Duration::from_millis(50);

type Routes<S> = HashMap<(&'static str, &'static str), Arc<dyn Route<S>>>;

/// Delivers committed outbox events to typed handlers, at least once each.
///
/// Build one with [`Relay::builder`], then [`run_until`](Relay::run_until) a shutdown signal.
/// Any number of relays, in one process or many, can share one outbox table: a leased row is
/// hidden from the others until its lease is acknowledged or expires.
pub struct Relay<S = ()> {
    pool: PgPool,
    state: S,
    routes: Routes<S>,
    /// The `(aggregate_type, event_type)` pairs with a handler, column-wise, for the lease filter.
    handled: (Vec<String>, Vec<String>),
    config: RelayConfig,
    metrics: RelayMetrics,
}

impl<S: Clone + Send + Sync + 'static> Relay<S> {
    fn new(pool: PgPool, state: S, routes: Routes<S>, config: RelayConfig) -> Self {
        let handled = routes.keys().map(|&(a, e)| (a.to_owned(), e.to_owned())).unzip();
        Self { pool, state, routes, handled, config, metrics: RelayMetrics::default() }
    }

    /// A live view of this relay's counters, usable while it runs.
    pub fn metrics(&self) -> RelayMetrics {
        self.metrics.clone()
    }

    /// Runs the relay until `shutdown` completes, then shuts down gracefully: stops leasing,
    /// hands back rows it leased but did not start, waits up to the shutdown timeout for running
    /// handlers (cancelling and handing back the rest), writes the last acknowledgements, and
    /// returns what it did.
    ///
    /// Database errors are logged and retried, never fatal, except a missing outbox schema.
    ///
    /// ```no_run
    /// # async fn run(relay: outbox_runtime::Relay) -> Result<(), outbox_runtime::Error> {
    /// let counts = relay.run_until(async { tokio::signal::ctrl_c().await.ok(); }).await?;
    /// println!("delivered {} events", counts.delivered);
    /// # Ok(()) }
    /// ```
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> Result<RelayCounts, Error> {
        let config = &self.config;
        // The relay's own statements get connections of their own, so a pool busy with
        // handlers (or starved by them) cannot delay a lease renewal past its deadline.
        // Named, so operators (and tests) can find them in pg_stat_activity.
        // No ping before each statement (sqlx's default): it doubles the round trips of the
        // lease, the drain's bound, and a broken connection fails the statement anyway, which
        // the relay retries.
        let options = |name| (*self.pool.connect_options()).clone().application_name(name);
        let own_pool = |connections| {
            PgPoolOptions::new().max_connections(connections).test_before_acquire(false)
        };
        // Every statement of the relay reuses one plan made to be safe whatever the table's
        // statistics (see `RELAY_SESSION`). Set after connecting: poolers such as PgBouncer
        // refuse such startup options.
        let own_pool = |connections| {
            own_pool(connections).after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute(store::RELAY_SESSION).await?;
                    Ok(())
                })
            })
        };
        let relay_pool = own_pool(4).connect_lazy_with(options("outbox-relay"));
        let listen_pool = own_pool(1).connect_lazy_with(options("outbox-relay-listen"));
        let lease_pool = own_pool(1).connect_lazy_with(options("outbox-relay-lease"));
        let wake = Arc::new(Notify::new());
        let held = Held::new(config.lease_timeout);
        let (acks, acks_rx) = mpsc::unbounded_channel();
        // Background tasks die with this future, should the caller drop it instead of
        // signalling shutdown; leased rows then come back when their leases expire.
        let listener = AbortOnDrop(tokio::spawn(listener::listen(listen_pool, wake.clone())));

        let mut acker = AbortOnDrop(tokio::spawn(
            Acker {
                pool: relay_pool.clone(),
                held: held.clone(),
                metrics: self.metrics.clone(),
                backoff: config.backoff,
                max_attempts: config.max_attempts as i32,
                lease_timeout: config.lease_timeout,
            }
            .run(acks_rx),
        ));

        let retention = config.retention.map(|keep_for| {
            AbortOnDrop(tokio::spawn(crate::retention::purge_periodically(
                relay_pool.clone(),
                keep_for,
            )))
        });

        #[cfg(feature = "metrics")]
        let gauges = AbortOnDrop(tokio::spawn(metrics::refresh_gauges(relay_pool.clone())));

        self.metrics.set_running(true);
        let mut work = Work {
            queue: VecDeque::new(),
            tasks: JoinSet::new(),
            held,
            acks,
            pace: Pace::default(),
        };
        let pools = Pools { lease: &lease_pool, relay: &relay_pool };
        let result = self.work(pools, &mut work, &wake, shutdown).await;
        drop(listener);
        drop(retention);
        #[cfg(feature = "metrics")]
        drop(gauges);

        // Graceful shutdown.
        let Work { queue, mut tasks, acks, .. } = work;
        for delivery in queue {
            delivery.hand_back();
        }
        let finished = async { while tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(config.shutdown_timeout, finished).await.is_err() {
            tracing::warn!(
                cancelled = tasks.len(),
                "outbox handlers still running at the shutdown timeout; cancelling them"
            );
            tasks.shutdown().await; // cancelled deliveries hand their rows back
        }
        drop(acks);
        // With the database away the last acknowledgements could retry for a lease timeout;
        // shutdown gives up sooner, and those rows are delivered again after their leases.
        match tokio::time::timeout(config.shutdown_timeout, &mut acker.0).await {
            Ok(Err(error)) => tracing::error!(%error, "outbox acknowledger failed"),
            Err(_) => tracing::warn!("outbox acknowledgements unfinished at the shutdown timeout"),
            Ok(Ok(())) => {}
        }
        lease_pool.close().await;
        relay_pool.close().await;
        self.metrics.set_running(false);
        result.map(|()| self.metrics.counts())
    }

    /// Leases and starts deliveries until `shutdown`; returns early only on a fatal error.
    async fn work(
        &self,
        pools: Pools<'_>,
        work: &mut Work<S>,
        wake: &Notify,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Error> {
        let config = &self.config;
        let mut shutdown = std::pin::pin!(shutdown.fuse());
        let mut retry = FIRST_LEASE_RETRY;
        let types = match config.unknown_events {
            UnknownEvents::LeaveForOthers => Some(self.handled.1.clone()),
            UnknownEvents::Fail => None,
        };
        let mut idle = Idle::new(types, config.poll_interval);
        let result = 'work: loop {
            if shutdown.as_mut().now_or_never().is_some() {
                break Ok(());
            }
            while work.tasks.try_join_next().is_some() {}
            while work.tasks.len() >= config.concurrency {
                tokio::select! {
                    biased;
                    () = &mut shutdown => break 'work Ok(()),
                    _ = work.tasks.join_next() => {}
                }
            }
            if let Some(delivery) = work.queue.pop_front() {
                let event_id = delivery.row.event_id;
                work.tasks.spawn(delivery.run());
                tracing::trace!(%event_id, "outbox delivery started");
                continue;
            }
            let (held, unacknowledged) = work.held.counts();
            if unacknowledged >= MAX_UNACKNOWLEDGED {
                tracing::debug!(held, "outbox acknowledgements lag; waiting before leasing more");
                tokio::select! {
                    biased;
                    () = &mut shutdown => break 'work Ok(()),
                    () = work.held.settled() => {}
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                continue;
            }
            match self.lease(pools.lease, work).await {
                Ok(found) => {
                    retry = FIRST_LEASE_RETRY;
                    if found {
                        idle.found_work(pools.relay).await;
                        continue;
                    }
                    tokio::select! {
                        () = &mut shutdown => break Ok(()),
                        () = idle.wait(pools.relay, wake) => {}
                    }
                }
                Err(Error::SchemaMissing) => break Err(Error::SchemaMissing),
                Err(error) => {
                    tracing::warn!(%error, retry_in = ?retry, "cannot lease outbox events");
                    tokio::select! {
                        () = &mut shutdown => break Ok(()),
                        () = tokio::time::sleep(retry) => {}
                    }
                    retry = retry.saturating_mul(2).min(Duration::from_secs(30));
                }
            }
        };
        idle.unregister(pools.relay).await;
        result
    }

    /// Leases one batch and queues its deliveries; returns whether it found rows.
    ///
    /// It leases no more rows than the handlers can start before the leases need renewing, so
    /// rows do not wait in the queue for longer than a renewal interval.
    async fn lease(&self, pool: &PgPool, work: &mut Work<S>) -> Result<bool, Error> {
        let config = &self.config;
        let filter = match config.unknown_events {
            UnknownEvents::LeaveForOthers => {
                LeaseFilter::Only { aggregate_types: &self.handled.0, event_types: &self.handled.1 }
            }
            UnknownEvents::Fail => LeaseFilter::All,
        };
        let limit =
            work.pace.lease_limit(config.concurrency, config.lease_timeout / 3, config.batch_size);
        let sent_at = tokio::time::Instant::now();
        let rows = store::lease(
            pool,
            LeaseRequest {
                limit: i64::from(limit),
                lease_timeout: config.lease_timeout,
                max_expired_leases: config.max_expired_leases as i32,
                skip_dead_ordered: config.dead_ordered_events == DeadOrderedEvents::SkipPast,
                filter,
            },
        )
        .await?;
        self.metrics.database_reached();
        let found = !rows.is_empty();
        for row in rows {
            if row.died {
                tracing::warn!(event_id = %row.event_id, "outbox event's lease expired too often; it is now dead");
                self.metrics.died_on_expiry(&row.event_type);
                continue;
            }
            // A row already held is already being delivered or acknowledged here.
            if let Some(lease) = work.held.lease(row.event_id, row.lease_token, sent_at) {
                work.queue.push_back(self.delivery(row, lease, work));
            }
        }
        Ok(found)
    }

    fn delivery(&self, row: LeasedEvent, lease: HeldLease, work: &Work<S>) -> Delivery<S> {
        let route =
            self.routes.get(&(row.aggregate_type.as_str(), row.event_type.as_str())).cloned();
        Delivery {
            route,
            state: self.state.clone(),
            row,
            lease,
            pool: self.pool.clone(),
            handler_timeout: self.config.handler_timeout,
            acks: work.acks.clone(),
            metrics: self.metrics.clone(),
            pace: work.pace.clone(),
        }
    }
}

/// The relay's connections: the lease's own, and the one for everything else it writes.
#[derive(Clone, Copy)]
struct Pools<'a> {
    lease: &'a PgPool,
    relay: &'a PgPool,
}

/// The loop's working set, kept apart from the relay so shutdown can drain it.
struct Work<S> {
    /// Deliveries of leased rows, not started yet.
    queue: VecDeque<Delivery<S>>,
    tasks: JoinSet<()>,
    held: Held,
    acks: mpsc::UnboundedSender<acker::Ack>,
    pace: Pace,
}

/// Aborts a spawned task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
