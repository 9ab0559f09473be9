//! The work loop: lease batches, queue their deliveries, start them as handler slots free up,
//! wait when there is nothing to lease; and, at the end, the graceful shutdown of what it began.
//!
//! A lease statement runs beside the deliveries, not between them: while a backlog drains, the
//! next lease starts when the queue runs low, so slots never wait for a lease round trip. A
//! delivery that waits for a broker's confirmation for milliseconds would otherwise leave most
//! slots empty during each lease, and forwarding would drain at a fraction of the handled rate.

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio::sync::{mpsc, Notify};
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;

use crate::error::{Error, ErrorChain};
use crate::forward::SinkHealth;
use crate::relay::acker::Ack;
use crate::relay::connections::Connections;
use crate::relay::cursor::Cursor;
use crate::relay::deliver::{panic_text, Delivery};
use crate::relay::held::{Held, Leasing};
use crate::relay::idle::Idle;
use crate::relay::pace::{BatchSize, Pace};
use crate::relay::Relay;
use crate::store::{Db, LeasePlan, LeasedEvent, Scan};

/// Most finished deliveries waiting for their acknowledgement before the relay stops leasing:
/// when acknowledgements lag, the relay does not take more rows than it can acknowledge.
const MAX_UNACKNOWLEDGED: usize = 1_000;

/// How often a relay whose acknowledgements lag looks again, if none settles meanwhile.
const ACKNOWLEDGEMENTS_RECHECK: Duration = Duration::from_millis(100);

/// How soon a failed lease is tried again, doubling up to 30 s while it keeps failing. Soon:
/// the usual failure is one broken pooled connection (after a database restart, say), which
/// the failure itself discarded.
pub(super) const FIRST_LEASE_RETRY: Duration = Duration::from_millis(50);

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
    /// While a backlog drains (the last lease came back full): the queue length at which the
    /// next lease starts, early enough that its rows arrive before the slots run dry. `None`
    /// once caught up: the next lease then waits for an empty queue and a free slot, so a
    /// relay that keeps up holds no more rows than it can start.
    refill_below: Option<usize>,
}

/// A lease statement under way, and what recording its rows needs.
struct Lease<'r> {
    rows: BoxFuture<'r, Result<Vec<LeasedEvent>, sqlx::Error>>,
    plan: &'r LeasePlan,
    /// Whether `plan` is the one for while the sink is unavailable, which has a cursor of its own.
    sink_down: bool,
    asked: u32,
    from_head: bool,
    sent_at: Instant,
    /// Until its rows are recorded (see [`Held::leasing`]).
    _leasing: Leasing,
}

/// What the next lease waits for.
enum Next<'r> {
    /// Nothing: lease now, with this plan (`true`: the plan for while the sink is down).
    Lease(&'r LeasePlan, bool),
    /// The queue holds enough rows, or a lease is under way.
    Deliveries,
    /// A free handler slot (the relay has caught up).
    Slot,
    /// A wake-up or the poll interval: the last lease found nothing.
    Idle,
    /// This time: the last lease failed.
    Retry(Instant),
    /// Acknowledgements, which lag.
    Acknowledgements,
    /// The sink, which is away (the relay only forwards).
    Sink(&'r SinkHealth),
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
            refill_below: None,
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
        let mut idle = Idle::new(relay.plan.wakes_for.clone(), relay.config.poll_interval);
        let mut leasing: Option<Lease<'_>> = None;
        let mut caught_up = false;
        let mut retry = FIRST_LEASE_RETRY;
        let mut retry_at = None;
        let result = loop {
            if shutdown.as_mut().now_or_never().is_some() {
                break Ok(());
            }
            self.start_deliveries(relay.config.concurrency);
            let next = match leasing {
                Some(_) => Next::Deliveries,
                None => self.next(relay, caught_up, retry_at),
            };
            if let Next::Lease(plan, sink_down) = next {
                leasing = Some(self.start_lease(relay, plan, sink_down, &connections.lease));
            }
            let needs_slot = !self.queue.is_empty() || matches!(next, Next::Slot);
            tokio::select! {
                biased;
                () = &mut shutdown => break Ok(()),
                rows = lease_rows(&mut leasing) => {
                    let lease = leasing.take().expect("only a lease under way finishes");
                    match rows.map_err(Error::from) {
                        Ok(rows) => {
                            retry = FIRST_LEASE_RETRY;
                            caught_up = !self.record(relay, lease, rows);
                            if !caught_up {
                                idle.found_work(&connections.relay).await;
                            }
                        }
                        Err(Error::SchemaMissing) => break Err(Error::SchemaMissing),
                        Err(error) => {
                            tracing::warn!(error = %ErrorChain(&error), retry_in = ?retry, "cannot lease outbox events");
                            retry_at = Some(Instant::now() + retry);
                            retry = retry.saturating_mul(2).min(Duration::from_secs(30));
                        }
                    }
                }
                Some(joined) = self.tasks.join_next(), if needs_slot => log_panic(joined),
                () = until_lease(&next, &mut idle, connections, wake, &self.held) => match next {
                    Next::Idle => caught_up = false,
                    Next::Retry(_) => retry_at = None,
                    _ => {}
                },
            }
        };
        if let Some(mut lease) = leasing {
            // Its rows may be leased already: recorded, shutdown hands them back.
            if let Ok(rows) = lease.rows.as_mut().await {
                self.record(relay, lease, rows);
            }
        }
        idle.unregister(&connections.relay).await;
        result
    }

    /// Starts queued deliveries while slots are free.
    fn start_deliveries(&mut self, concurrency: usize) {
        while let Some(joined) = self.tasks.try_join_next() {
            log_panic(joined);
        }
        while self.tasks.len() < concurrency {
            let Some(delivery) = self.queue.pop_front() else { break };
            // Boxed: spawning moves a future several times, and a delivery's is large.
            self.tasks.spawn(delivery.run().boxed());
        }
    }

    /// What the next lease waits for, when no lease is under way.
    fn next<'r>(
        &self,
        relay: &'r Relay<S>,
        caught_up: bool,
        retry_at: Option<Instant>,
    ) -> Next<'r> {
        let wants_rows = match self.refill_below {
            Some(below) => self.queue.len() <= below,
            None => self.queue.is_empty(),
        };
        if !wants_rows {
            return Next::Deliveries;
        }
        if let Some(at) = retry_at {
            return Next::Retry(at);
        }
        if caught_up {
            return Next::Idle;
        }
        if self.refill_below.is_none() && self.tasks.len() >= relay.config.concurrency {
            return Next::Slot;
        }
        if self.held.counts().1 >= MAX_UNACKNOWLEDGED {
            return Next::Acknowledgements;
        }
        match relay.lease_plan_now() {
            Ok((plan, sink_down)) => Next::Lease(plan, sink_down),
            Err(health) => Next::Sink(health),
        }
    }

    /// Starts a lease statement with `plan`; it runs while the loop goes on.
    ///
    /// It leases no more rows than the handlers can start before the leases need renewing, so
    /// rows do not wait in the queue for longer than a renewal interval.
    fn start_lease<'r>(
        &self,
        relay: &Relay<S>,
        plan: &'r LeasePlan,
        sink_down: bool,
        db: &Db,
    ) -> Lease<'r> {
        let config = &relay.config;
        let asked = self.pace.lease_limit(
            config.concurrency,
            config.lease_timeout / 3,
            self.batch_size.next(),
        );
        let leasing = self.held.leasing();
        let cursor = if sink_down { &self.cursor_while_sink_down } else { &self.cursor };
        // Owned, so that the statement outlives this borrow of the loop's state.
        let positions = match cursor.scan() {
            Scan::Full => None,
            Scan::From(positions) => Some(positions.clone()),
        };
        let from_head = positions.is_none();
        let held = self.held.ids();
        let db = db.clone();
        let rows = async move {
            let scan = positions.as_ref().map_or(Scan::Full, Scan::From);
            db.lease(plan, scan, i64::from(asked), &held).await
        };
        Lease {
            rows: rows.boxed(),
            plan,
            sink_down,
            asked,
            from_head,
            sent_at: Instant::now(),
            _leasing: leasing,
        }
    }

    /// Records a lease's rows and queues their deliveries; returns whether it found rows.
    fn record(&mut self, relay: &Relay<S>, lease: Lease<'_>, rows: Vec<LeasedEvent>) -> bool {
        relay.metrics.database_reached();
        self.batch_size.found(lease.asked, rows.len());
        let cursor =
            if lease.sink_down { &mut self.cursor_while_sink_down } else { &mut self.cursor };
        cursor.leased(lease.plan, lease.from_head, lease.asked, rows.iter());
        let full = rows.len() >= lease.asked as usize;
        // Half a lease ahead: its statement returns long before half a lease is delivered.
        self.refill_below = full.then(|| (rows.len() / 2).max(relay.config.concurrency));
        let found = !rows.is_empty();
        let deadline = lease.sent_at + relay.config.lease_timeout;
        for row in rows {
            if row.died {
                let event_id = row.event_id;
                tracing::warn!(%event_id, "outbox event's lease expired too often; it is now dead");
                relay.metrics.died_on_expiry(&row.event_type);
                continue;
            }
            // A row already held is already being delivered or acknowledged here.
            if let Some(held) = self.held.lease(row.event_id, row.lease_token, deadline) {
                self.queue.push_back(relay.delivery(row, held, &self.acks, &self.pace));
            }
        }
        found
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

/// The rows of the lease under way; never resolves without one.
async fn lease_rows(leasing: &mut Option<Lease<'_>>) -> Result<Vec<LeasedEvent>, sqlx::Error> {
    match leasing {
        Some(lease) => lease.rows.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Waits until what holds back the next lease is over; never resolves if nothing does.
async fn until_lease(
    next: &Next<'_>,
    idle: &mut Idle,
    connections: &Connections,
    wake: &Notify,
    held: &Held,
) {
    match next {
        Next::Idle => idle.wait(&connections.relay, wake).await,
        Next::Retry(at) => tokio::time::sleep_until(*at).await,
        Next::Acknowledgements => {
            tracing::debug!(
                held = held.counts().0,
                "outbox acknowledgements lag; waiting before leasing more"
            );
            tokio::select! {
                () = held.settled() => {}
                () = tokio::time::sleep(ACKNOWLEDGEMENTS_RECHECK) => {}
            }
        }
        Next::Sink(health) => health.available().await,
        Next::Lease(..) | Next::Deliveries | Next::Slot => std::future::pending().await,
    }
}

/// A delivery that panicked outside its handler's guard (the handler's own panics are caught
/// and recorded as its failures): its attempt was recorded by the delivery's guard; the panic
/// itself is only here.
pub(super) fn log_panic(joined: Result<(), JoinError>) {
    if let Err(error) = joined {
        if error.is_panic() {
            let panic = error.into_panic();
            let panic = panic_text(&*panic);
            tracing::error!(%panic, "outbox delivery panicked outside its handler; attempt counted");
        }
    }
}
