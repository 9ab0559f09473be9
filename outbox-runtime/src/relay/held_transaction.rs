//! The held-transaction mode ([`LeaseMode::HeldTransaction`](crate::LeaseMode)): one batch at a
//! time, in a transaction of the relay's own that locks the rows (`store::hold`), delivers
//! them and writes their outcomes before it commits.
//!
//! The row locks are the lease: every other relay's lease skips the rows (`SKIP LOCKED`), and
//! the rows that must wait for them (the next events of an ordered aggregate) stay behind them
//! until the commit, since the locked rows are still pending. Nothing is written to a row but
//! its outcome. The deliveries are the written mode's (`deliver.rs`), each under a deadline
//! (`held.rs`) that a keep-alive statement moves while the transaction answers. When one fails
//! the connection is gone and the server has released the locks: the deliveries are cancelled
//! at once, and the rows are delivered again, here or by another relay.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::time::Duration;

use futures_util::future::FusedFuture;
use futures_util::FutureExt;
use sqlx::{PgConnection, PgPool};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::{Error, ErrorChain};
use crate::relay::acker::{Ack, Outcome};
use crate::relay::connections::Connections;
use crate::relay::cursor::Cursor;
use crate::relay::held::Held;
use crate::relay::idle::Idle;
use crate::relay::pace::{BatchSize, Pace};
use crate::relay::work::{log_panic, FIRST_LEASE_RETRY};
use crate::relay::{Relay, LAST_ACKS_GRACE};
use crate::store::{self, Failures, LeasePlan, OnPublish, Scan, Snoozes};

/// The longest time between two statements of a batch's transaction: how late, at worst, the
/// relay learns that its connection (and so its locks) is gone, and cancels the deliveries.
const MOST_BETWEEN_KEEP_ALIVES: Duration = Duration::from_secs(1);

/// How a batch ended.
enum Batch {
    /// Its rows were delivered and their outcomes written (or will be delivered again).
    Delivered,
    /// The lease found nothing.
    Empty,
    /// Shutdown came while it ran: what had finished was written, the rest handed back.
    ShutDown,
}

/// Leases, delivers and acknowledges batches until `shutdown`; returns early only on a fatal
/// error.
pub(crate) async fn run<S: Clone + Send + Sync + 'static>(
    relay: &Relay<S>,
    connections: &Connections,
    wake: &Notify,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let mut shutdown = std::pin::pin!(shutdown.fuse());
    let mut idle = Idle::new(relay.plan.wakes_for.clone(), relay.config.poll_interval);
    let mut batches = Batches {
        held: Held::new(),
        pace: Pace::default(),
        batch_size: BatchSize::new(relay.config.batch_size),
        cursor: Cursor::default(),
        cursor_while_sink_down: Cursor::default(),
    };
    let mut retry = FIRST_LEASE_RETRY;
    let result = loop {
        let sink_down = relay.forwarding.as_ref().filter(|f| !f.health.is_available());
        let (plan, sink_down) = match (sink_down, &relay.plan.while_sink_down) {
            (None, _) => (&relay.plan.lease, false),
            (Some(_), Some(handled_only)) => (handled_only, true),
            (Some(forwarding), None) => {
                tokio::select! {
                    () = &mut shutdown => break Ok(()),
                    () = forwarding.health.available() => continue,
                }
            }
        };
        let batch = tokio::select! {
            biased;
            () = &mut shutdown => break Ok(()),
            // Waits for nothing but the database: once it has rows, the batch itself watches
            // for shutdown.
            leased = batches.lease(relay, plan, sink_down, &connections.lease) => leased,
        };
        let ended = match batch {
            Ok(Some(leased)) => Ok(batches.deliver(relay, leased, &mut shutdown).await),
            Ok(None) => Ok(Batch::Empty),
            Err(error) => Err(Error::from(error)),
        };
        match ended {
            Ok(Batch::ShutDown) => break Ok(()),
            Ok(Batch::Delivered) => {
                retry = FIRST_LEASE_RETRY;
                idle.found_work(&connections.relay).await;
            }
            Ok(Batch::Empty) => {
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

/// What the batches of a run share.
struct Batches {
    /// The rows of the batch under way: their deadlines, which its deliveries watch.
    held: Held,
    pace: Pace,
    batch_size: BatchSize,
    cursor: Cursor,
    cursor_while_sink_down: Cursor,
}

/// A batch's transaction, holding its rows' locks, and the deliveries of those rows.
struct Leased<S> {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    deliveries: VecDeque<crate::relay::deliver::Delivery<S>>,
    outcomes: mpsc::UnboundedReceiver<Ack>,
}

impl Batches {
    /// Begins a transaction and locks a batch in it; `None`, and the transaction ended, when it
    /// found nothing.
    async fn lease<S: Clone + Send + Sync + 'static>(
        &mut self,
        relay: &Relay<S>,
        plan: &LeasePlan,
        sink_down: bool,
        pool: &PgPool,
    ) -> Result<Option<Leased<S>>, sqlx::Error> {
        let config = &relay.config;
        let asked = self.pace.lease_limit(
            config.concurrency,
            config.lease_timeout / 3,
            self.batch_size.next(),
        );
        let cursor = if sink_down { &mut self.cursor_while_sink_down } else { &mut self.cursor };
        let mut tx = pool.begin().await?;
        let token = Uuid::new_v4();
        let sent_at = Instant::now();
        let scan = cursor.scan();
        let from_head = matches!(scan, Scan::Full);
        let rows = store::hold(&mut tx, plan, scan, i64::from(asked), token).await?;
        relay.metrics.database_reached();
        self.batch_size.found(asked, rows.len());
        cursor.leased(plan, from_head, asked, &rows);
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(None);
        }
        let deadline = sent_at + config.lease_timeout;
        let (acks, outcomes) = mpsc::unbounded_channel();
        let deliveries = rows
            .into_iter()
            .filter_map(|row| {
                let lease = self.held.lease(row.event_id, token, deadline)?;
                Some(relay.delivery(row, lease, &acks, &self.pace))
            })
            .collect();
        Ok(Some(Leased { tx, deliveries, outcomes }))
    }

    /// Runs the batch's deliveries, keeping its transaction alive, then writes their outcomes
    /// and commits. At `shutdown` it starts no more deliveries and waits for the running ones
    /// until the shutdown timeout.
    async fn deliver<S: Clone + Send + Sync + 'static>(
        &mut self,
        relay: &Relay<S>,
        leased: Leased<S>,
        shutdown: &mut (impl FusedFuture<Output = ()> + Unpin),
    ) -> Batch {
        let Leased { mut tx, mut deliveries, mut outcomes } = leased;
        let config = &relay.config;
        let mut tasks = JoinSet::new();
        let mut keep_alive =
            tokio::time::interval((config.lease_timeout / 3).min(MOST_BETWEEN_KEEP_ALIVES));
        keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        keep_alive.tick().await;
        let mut stop_at = None;
        loop {
            while stop_at.is_none() && tasks.len() < config.concurrency {
                let Some(delivery) = deliveries.pop_front() else { break };
                tasks.spawn(delivery.run());
            }
            if tasks.is_empty() {
                break;
            }
            tokio::select! {
                biased;
                () = &mut *shutdown, if stop_at.is_none() => {
                    stop_at = Some(Instant::now() + config.shutdown_timeout);
                    deliveries.drain(..).for_each(|delivery| delivery.hand_back());
                }
                () = sleep_until(stop_at), if stop_at.is_some() => {
                    tracing::warn!(
                        cancelled = tasks.len(),
                        "outbox handlers still running at the shutdown timeout; cancelling them"
                    );
                    tasks.shutdown().await; // cancelled deliveries hand their rows back
                }
                Some(joined) = tasks.join_next() => log_panic(joined),
                _ = keep_alive.tick() => self.keep_alive(&mut tx, config.lease_timeout).await,
            }
        }
        // Every delivery has sent its outcome: the senders are gone.
        let mut acks = Vec::new();
        while let Some(ack) = outcomes.recv().await {
            acks.push(ack);
        }
        let writing = async {
            let dead = write(&mut tx, &acks, config.on_publish).await?;
            tx.commit().await.map(|()| dead)
        };
        // A database that hangs holds the batch no longer than a lease, or at shutdown than the
        // shutdown timeout and a moment: then the rows are delivered again.
        let written = match stop_at {
            None => tokio::time::timeout(config.lease_timeout, writing).await,
            Some(at) => {
                let until = at.max(Instant::now() + LAST_ACKS_GRACE);
                tokio::time::timeout_at(until, writing).await
            }
        };
        self.held.settle(acks.iter().map(|ack| ack.event_id));
        match written {
            Ok(Ok(dead)) => count(relay, &acks, &dead),
            Ok(Err(error)) => tracing::error!(
                error = %ErrorChain(&error),
                rows = acks.len(),
                "cannot write the outcomes of an outbox batch; its rows will be delivered again"
            ),
            Err(_) => tracing::error!(
                rows = acks.len(),
                "the outcomes of an outbox batch were not written in time; its rows will be \
                 delivered again"
            ),
        }
        if stop_at.is_some() {
            Batch::ShutDown
        } else {
            Batch::Delivered
        }
    }

    /// Runs a statement in the batch's transaction: while it answers, the locks are held, and
    /// the deliveries' deadlines move; once it fails they are not, and the deliveries stop.
    async fn keep_alive(&self, tx: &mut PgConnection, lease_timeout: Duration) {
        let sent_at = Instant::now();
        match sqlx::query("SELECT 1").execute(tx).await {
            Ok(_) => self.held.extend_all(sent_at + lease_timeout),
            Err(error) => {
                tracing::warn!(
                    error = %ErrorChain(&error),
                    "outbox batch's transaction lost, and with it the rows' locks: deliveries \
                     cancelled, the rows will be delivered again"
                );
                self.held.expire_all();
            }
        }
    }
}

/// Sleeps until `at`; never completes without it.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Writes a batch's outcomes in its transaction, one statement per kind; returns the rows that
/// died of their failure. Rows handed back are left as they were: available.
async fn write(
    tx: &mut PgConnection,
    acks: &[Ack],
    on_publish: OnPublish,
) -> Result<HashSet<Uuid>, sqlx::Error> {
    let mut delivered = Vec::new();
    let (mut failures, mut failed) = (Failures::default(), 0);
    let (mut snoozes, mut snoozed) = (Snoozes::default(), 0);
    // The locks fence these rows: no token is checked.
    let token = Uuid::nil();
    for ack in acks {
        match &ack.outcome {
            Outcome::Delivered => delivered.push(ack.event_id),
            Outcome::Failed(failure) => {
                // A rejected row dies at any count of attempts.
                let max_attempts = if failure.rejected { 0 } else { failure.max_attempts };
                let error = failure.error.clone();
                failures.push(ack.event_id, token, error, failure.retry_in, max_attempts);
                failed += 1;
            }
            Outcome::Snoozed { delay } => {
                snoozes.push(ack.event_id, token, *delay);
                snoozed += 1;
            }
            Outcome::HandedBack | Outcome::Published | Outcome::LeaseLost => {}
        }
    }
    if !delivered.is_empty() {
        store::publish_held(&mut *tx, &delivered, on_publish).await?;
    }
    let mut dead = HashSet::new();
    if failed > 0 {
        let written = store::fail_held(&mut *tx, &failures).await?;
        dead.extend(written.into_iter().filter(|(_, died)| *died).map(|(id, _)| id));
    }
    if snoozed > 0 {
        store::snooze_held(&mut *tx, &snoozes).await?;
    }
    Ok(dead)
}

/// Counts a committed batch's outcomes.
fn count<S>(relay: &Relay<S>, acks: &[Ack], dead: &HashSet<Uuid>) {
    let metrics = &relay.metrics;
    let mut handed_back = 0;
    for ack in acks {
        match &ack.outcome {
            Outcome::Delivered | Outcome::Published => {
                metrics.delivered(&ack.event_type, ack.created_at)
            }
            Outcome::Failed(failure) => {
                metrics.failed(&ack.event_type, dead.contains(&ack.event_id), failure.rejected)
            }
            Outcome::Snoozed { .. } => metrics.snoozed(&ack.event_type),
            Outcome::HandedBack | Outcome::LeaseLost => handed_back += 1,
        }
    }
    metrics.handed_back(handed_back);
    if !dead.is_empty() {
        tracing::warn!(?dead, "outbox events exhausted their attempts and are now dead");
    }
}
