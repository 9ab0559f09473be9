//! Wake-ups: LISTEN for the insert trigger's NOTIFY, reconnecting whenever the connection drops.
//!
//! Each time it subscribes (at start, and after a reconnection failed), the listener checks that
//! notifications reach it: it sends one with a payload of its own from another connection. One can LISTEN and never hear
//! anything: through a pooler in transaction mode, for one, the LISTEN registers the server
//! connection it happened to run on, which goes back to the pool, and the pooler drops what
//! that connection is sent while no client holds it. If the check's notification has not
//! arrived within [`CHECK_WITHIN`], the listener warns, once per run, that the relay is polling
//! instead; it keeps listening, and says so if the notification arrives after all.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::error::ErrorChain;
use crate::store::{self, NOTIFY_CHANNEL};

/// How long the check's notification may take. A NOTIFY reaches an idle listener within
/// milliseconds, even on a loaded machine: a miss this long means none will.
const CHECK_WITHIN: Duration = Duration::from_secs(3);

/// Runs until cancelled, waking the relay on every notification and after every reconnect
/// (notifications sent while disconnected are lost, so the relay must look for itself). The
/// check's notification goes out through `notifier`; `poll_interval` is what the warning
/// names when none arrives.
pub(crate) async fn listen(
    pool: PgPool,
    notifier: PgPool,
    wake: Arc<Notify>,
    poll_interval: Duration,
) {
    let mut retry = Duration::from_millis(100);
    let mut warned = false;
    loop {
        match subscribe(&pool).await {
            Ok(mut listener) => {
                retry = Duration::from_millis(100);
                wake.notify_one();
                let check = Check::new();
                // The receiving loop is never cancelled mid-read: the check ends in `pending`.
                tokio::select! {
                    error = receive(&mut listener, &wake, &check) => {
                        tracing::warn!(error = %ErrorChain(&error), "outbox LISTEN connection failed");
                    }
                    never = check.run(&notifier, poll_interval, &mut warned) => match never {},
                }
            }
            Err(error) => {
                tracing::warn!(error = %ErrorChain(&error), "cannot LISTEN for outbox events; polling meanwhile")
            }
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(Duration::from_secs(10));
    }
}

async fn subscribe(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(NOTIFY_CHANNEL).await?;
    Ok(listener)
}

/// Wakes the relay on each notification but the check's, until the listener fails.
async fn receive(listener: &mut PgListener, wake: &Notify, check: &Check) -> sqlx::Error {
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) if notification.payload() == check.payload => {
                check.arrived.notify_one();
            }
            Ok(Some(_)) => wake.notify_one(),
            // The connection dropped; the next try_recv reconnects and re-LISTENs.
            Ok(None) => {
                tracing::debug!("outbox LISTEN connection lost, reconnecting");
                wake.notify_one();
            }
            Err(error) => return error,
        }
    }
}

/// The check that notifications reach this listener.
struct Check {
    /// Unique to this check, so no other relay's notification (nor a producer's, whose payload
    /// is empty) passes for it.
    payload: String,
    arrived: Notify,
}

impl Check {
    fn new() -> Self {
        Check { payload: format!("outbox-relay-check {}", Uuid::new_v4()), arrived: Notify::new() }
    }

    /// Sends the notification (trying again while the database cannot be reached) and waits for
    /// it; warns if it does not come in time, unless `warned` says this relay has warned
    /// already. Then waits forever.
    async fn run(
        &self,
        notifier: &PgPool,
        poll_interval: Duration,
        warned: &mut bool,
    ) -> Infallible {
        let mut retry = Duration::from_millis(100);
        while let Err(error) = self.send(notifier).await {
            tracing::debug!(error = %ErrorChain(&error), retry_in = ?retry, "cannot check the outbox wake-ups");
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(Duration::from_secs(10));
        }
        match tokio::time::timeout(CHECK_WITHIN, self.arrived.notified()).await {
            Ok(()) => tracing::debug!("outbox wake-ups checked"),
            Err(_) => {
                if !std::mem::replace(warned, true) {
                    tracing::warn!(
                        ?poll_interval,
                        "outbox wake-ups are unavailable: a notification sent to the relay's \
                         LISTEN connection did not arrive (something between them drops \
                         notifications, as poolers in transaction mode do); the relay looks for \
                         new events every poll interval instead"
                    );
                }
                self.arrived.notified().await;
                tracing::info!(
                    "outbox wake-ups work after all: the check's notification came late"
                );
            }
        }
        std::future::pending().await
    }

    async fn send(&self, notifier: &PgPool) -> Result<(), sqlx::Error> {
        store::notify_relays(notifier, &self.payload).await
    }
}
