//! The work loop: lease a batch, queue its deliveries, start them as handler slots free up,
//! wait when there is nothing to lease; and, at the end, the graceful shutdown of what it began.

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use futures_util::FutureExt;
use sqlx::PgPool;
use tokio::sync::{mpsc, Notify};
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;

use crate::error::{Error, ErrorChain};
use crate::relay::acker::Ack;
use crate::relay::connections::Connections;
use crate::relay::cursor::Cursor;
use crate::relay::deliver::{panic_text, Delivery};
use crate::relay::held::Held;
use crate::relay::idle::Idle;
use crate::relay::pace::{BatchSize, Pace};
use crate::relay::Relay;
use crate::store::{self, LeasePlan};

/// Most finished deliveries waiting for their acknowledgement before the relay stops leasing:
/// when acknowledgements lag, the relay does not take more rows than it can acknowledge.
const MAX_UNACKNOWLEDGED: usize = 1_000;

/// How soon a failed lease is tried again, doubling up to 30 s while it keeps failing. Soon:
/// the usual failure is one broken pooled connection (after a database restart, say), which
/// the failure itself discarded.
const FIRST_LEASE_RETRY: Duration = Duration::from_millis(50);

/// What the loop has begun: queued and running deliveries, and the leases it holds.
pub(crate) struct Work<S> {
    /// Deliveries of leased rows, not started yet.
    queue: VecDeque<Delivery<S>>,
    tasks: JoinSet<()>,
    held: Held,
    acks: mpsc::UnboundedSender<Ack>,
    pace: Pace,
    batch_size: BatchSize,
    cursor: Cursor,
    cursor_while_sink_down: Cursor,
}

impl<S: Clone + Send + Sync + 'static> Work<S> {
    pub(crate) fn new(
        held: Held,
        acks: mpsc::UnboundedSender<Ack>,
        batch_size: Option<u32>,
    ) -> Self {
        Work {
            queue: VecDeque::new(),
            tasks: JoinSet::new(),
            held,
            acks,
            pace: Pace::default(),
            batch_size: BatchSize::new(batch_size),
            cursor: Cursor::default(),
            cursor_while_sink_down: Cursor::default(),
        }
    }

    /// Leases and starts deliveries until `shutdown`; returns early only on a fatal error.
    pub(crate) async fn run(
        &mut self,
        relay: &Relay<S>,
        connections: &Connections,
        wake: &Notify,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Error> {
        let mut shutdown = std::pin::pin!(shutdown.fuse());
        let mut retry = FIRST_LEASE_RETRY;
        let mut idle = Idle::new(relay.plan.wakes_for.clone(), relay.config.poll_interval);
        let result = 'work: loop {
            if shutdown.as_mut().now_or_never().is_some() {
                break Ok(());
            }
            while let Some(joined) = self.tasks.try_join_next() {
                log_panic(joined);
            }
            while self.tasks.len() >= relay.config.concurrency {
                tokio::select! {
                    biased;
                    () = &mut shutdown => break 'work Ok(()),
                    Some(joined) = self.tasks.join_next() => log_panic(joined),
                }
            }
            if let Some(delivery) = self.queue.pop_front() {
                self.tasks.spawn(delivery.run());
                continue;
            }
            let (held, unacknowledged) = self.held.counts();
            if unacknowledged >= MAX_UNACKNOWLEDGED {
                tracing::debug!(held, "outbox acknowledgements lag; waiting before leasing more");
                tokio::select! {
                    biased;
                    () = &mut shutdown => break 'work Ok(()),
                    () = self.held.settled() => {}
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                continue;
            }
            let sink_down = relay.forwarding.as_ref().filter(|f| !f.health.is_available());
            let plan = match (sink_down, &relay.plan.while_sink_down) {
                (None, _) => &relay.plan.lease,
                (Some(_), Some(handled_only)) => handled_only,
                (Some(forwarding), None) => {
                    // Only forwarding, and the sink is away: nothing to lease until it answers.
                    tokio::select! {
                        () = &mut shutdown => break Ok(()),
                        () = forwarding.health.available() => {}
                    }
                    continue;
                }
            };
            match self.lease(relay, plan, sink_down.is_some(), &connections.lease).await {
                Ok(true) => {
                    retry = FIRST_LEASE_RETRY;
                    idle.found_work(&connections.relay).await;
                }
                Ok(false) => {
                    retry = FIRST_LEASE_RETRY;
                    tokio::select! {
                        () = &mut shutdown => break Ok(()),
                        () = idle.wait(&connections.relay, wake) => {}
                    }
                }
                Err(Error::SchemaMissing) => break Err(Error::SchemaMissing),
                Err(error) => {
                    tracing::warn!(error = %ErrorChain(&error), retry_in = ?retry, "cannot lease outbox events");
                    tokio::select! {
                        () = &mut shutdown => break Ok(()),
                        () = tokio::time::sleep(retry) => {}
                    }
                    retry = retry.saturating_mul(2).min(Duration::from_secs(30));
                }
            }
        };
        idle.unregister(&connections.relay).await;
        result
    }

    /// Leases one batch and queues its deliveries; returns whether it found rows.
    ///
    /// It leases no more rows than the handlers can start before the leases need renewing, so
    /// rows do not wait in the queue for longer than a renewal interval.
    /// `sink_down`: whether `plan` is the one for while the sink is unavailable, which has a
    /// cursor of its own.
    async fn lease(
        &mut self,
        relay: &Relay<S>,
        plan: &LeasePlan,
        sink_down: bool,
        pool: &PgPool,
    ) -> Result<bool, Error> {
        let config = &relay.config;
        let limit = self.pace.lease_limit(
            config.concurrency,
            config.lease_timeout / 3,
            self.batch_size.next(),
        );
        let _leasing = self.held.leasing(); // until its rows are recorded below
        let sent_at = Instant::now();
        let cursor = if sink_down { &mut self.cursor_while_sink_down } else { &mut self.cursor };
        let scan = cursor.scan();
        let from_head = matches!(scan, store::Scan::Full);
        let held = self.held.ids();
        let rows = store::lease(pool, plan, scan, i64::from(limit), &held).await?;
        relay.metrics.database_reached();
        self.batch_size.found(limit, rows.len());
        cursor.leased(plan, from_head, limit, &rows);
        let found = !rows.is_empty();
        for row in rows {
            if row.died {
                let event_id = row.event_id;
                tracing::warn!(%event_id, "outbox event's lease expired too often; it is now dead");
                relay.metrics.died_on_expiry(&row.event_type);
                continue;
            }
            // A row already held is already being delivered or acknowledged here.
            let deadline = sent_at + config.lease_timeout;
            if let Some(lease) = self.held.lease(row.event_id, row.lease_token, deadline) {
                let route = relay.route(&row);
                self.queue.push_back(Delivery {
                    route,
                    upcasters: relay.upcasters.clone(),
                    state: relay.state.clone(),
                    row,
                    lease,
                    pool: relay.pool.clone(),
                    config: relay.config.clone(),
                    acks: self.acks.clone(),
                    metrics: relay.metrics.clone(),
                    pace: self.pace.clone(),
                });
            }
        }
        Ok(found)
    }

    /// Hands back the rows not started, waits until `deadline` for running handlers, and
    /// cancels (and so hands back) the rest. Ends the acknowledgements: the acknowledger stops
    /// once it has written what the deliveries sent.
    pub(crate) async fn shut_down(self, deadline: Instant) {
        let Work { queue, mut tasks, .. } = self;
        for delivery in queue {
            delivery.hand_back();
        }
        let finished = async {
            while let Some(joined) = tasks.join_next().await {
                log_panic(joined);
            }
        };
        if tokio::time::timeout_at(deadline, finished).await.is_err() {
            tracing::warn!(
                cancelled = tasks.len(),
                "outbox handlers still running at the shutdown timeout; cancelling them"
            );
            tasks.shutdown().await; // cancelled deliveries hand their rows back
        }
    }
}

/// A delivery that panicked outside its handler's guard (the handler's own panics are caught
/// and recorded as its failures): its attempt was recorded by the delivery's guard; the panic
/// itself is only here.
fn log_panic(joined: Result<(), JoinError>) {
    if let Err(error) = joined {
        if error.is_panic() {
            let panic = error.into_panic();
            let panic = panic_text(&*panic);
            tracing::error!(%panic, "outbox delivery panicked outside its handler; attempt counted");
        }
    }
}
