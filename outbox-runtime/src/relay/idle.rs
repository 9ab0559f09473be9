//! How a relay waits when it finds nothing to lease.
//!
//! Right after finding work it lingers, looking again every few milliseconds: under load the
//! next events are moments away, and looking costs less than being woken. Then it registers as
//! asleep in `outbox.sleeping_relays` and waits for a NOTIFY or the poll interval. Producers
//! send NOTIFY only while a relay that wants their event type is registered, because NOTIFY
//! makes committing transactions queue on a database-wide lock.

use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;

use crate::store;

/// How long a relay keeps looking by itself after it last found rows.
const LINGER: Duration = Duration::from_millis(50);
/// How often it looks while lingering.
const LINGER_POLL: Duration = Duration::from_millis(2);

pub(crate) struct Idle {
    relay_id: Uuid,
    /// The event types this relay leases; `None` for all.
    event_types: Option<Vec<String>>,
    poll_interval: Duration,
    lingering_until: Instant,
    /// Until when this relay's registration as a sleeper holds, if it is registered.
    registered_until: Option<Instant>,
}

impl Idle {
    pub(crate) fn new(event_types: Option<Vec<String>>, poll_interval: Duration) -> Self {
        Idle {
            relay_id: Uuid::new_v4(),
            event_types,
            poll_interval,
            lingering_until: Instant::now(),
            registered_until: None,
        }
    }

    /// The relay found rows: it is awake, and producers need not wake it.
    pub(crate) async fn found_work(&mut self, pool: &PgPool) {
        self.lingering_until = Instant::now() + LINGER;
        if self.registered_until.take().is_some() {
            self.unregister(pool).await;
        }
    }

    /// The relay found nothing: waits until it should look again.
    pub(crate) async fn wait(&mut self, pool: &PgPool, wake: &Notify) {
        let now = Instant::now();
        if now < self.lingering_until {
            return nap(wake, LINGER_POLL).await;
        }
        let lapsing = self.registered_until.is_none_or(|until| until < now + self.poll_interval);
        if lapsing {
            let hold = self.poll_interval * 2 + Duration::from_secs(5);
            let types = self.event_types.as_deref();
            match store::register_sleeper(pool, self.relay_id, types, hold).await {
                // Registered: look once more before sleeping, for rows committed meanwhile.
                Ok(true) => return self.registered_until = Some(now + hold),
                // Producers are inserting right now: their rows are about to commit.
                Ok(false) => return nap(wake, LINGER_POLL).await,
                Err(error) => tracing::warn!(%error, "cannot register for outbox wake-ups"),
            }
        }
        nap(wake, self.poll_interval).await;
    }

    /// Withdraws the registration, if any: at shutdown, or once awake.
    pub(crate) async fn unregister(&mut self, pool: &PgPool) {
        self.registered_until = None;
        if let Err(error) = store::unregister_sleeper(pool, self.relay_id).await {
            tracing::debug!(%error, "cannot withdraw the outbox wake-up registration");
        }
    }
}

/// Sleeps for `duration` or until woken.
async fn nap(wake: &Notify, duration: Duration) {
    tokio::select! {
        () = wake.notified() => {}
        () = tokio::time::sleep(duration) => {}
    }
}
