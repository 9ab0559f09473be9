//! How a relay waits when it finds nothing to lease.
//!
//! Right after finding work it lingers, looking again every few milliseconds: under load the
//! next events are moments away, and looking costs less than being woken. Then it registers as
//! asleep in `outbox.sleeping_relays` and waits for a NOTIFY or the poll interval. Producers
//! send NOTIFY only while a relay that wants their event type is registered, because NOTIFY
//! makes committing transactions queue on a database-wide lock.
//!
//! Only PostgreSQL has NOTIFY: on the other databases a relay lingers alike, then looks again
//! at each poll interval.
//!
//! A producer that inserted before the registration raised the flag may never look for sleepers
//! (see `store/sleepers.rs`), so its commit may wake nobody. The relay reads which transactions
//! were writing to `outbox.events` once it registered, looks once more, and then again each time
//! one of them has ended, checking on them less and less often (from 2 ms up to every 500 ms): a
//! business transaction open for seconds costs a sleeping relay a few statements a second, not a
//! spin, and producers pay nothing for it. Renewing a registration that has not lapsed opens no
//! such gap: producers have seen it all along.

use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::Notify;
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::ErrorChain;
use crate::store::{self, Db};

/// How long a relay keeps looking by itself after it last found rows.
const LINGER: Duration = Duration::from_millis(50);
/// How often it looks while lingering.
const LINGER_POLL: Duration = Duration::from_millis(2);
/// How soon it first checks whether the transactions that were writing events when it registered
/// have ended; the wait doubles with each check that finds them all still open, up to
/// [`MOST_BETWEEN_CHECKS`] (and the poll interval). Soon: most transactions are short.
const FIRST_CHECK: Duration = Duration::from_millis(2);
/// The longest wait between two checks: how late, at worst, a relay looks for the rows of a long
/// transaction that emitted before it registered.
const MOST_BETWEEN_CHECKS: Duration = Duration::from_millis(500);

pub(crate) struct Idle {
    relay_id: Uuid,
    /// The event types this relay leases; `None` for all.
    event_types: Option<Vec<String>>,
    poll_interval: Duration,
    lingering_until: Instant,
    /// Until when this relay's registration as a sleeper holds, if it is registered.
    registered_until: Option<Instant>,
    /// The transactions that were writing events when this registration began and have not
    /// ended since: their commits may not wake this relay, so it looks for itself.
    unseen: Vec<String>,
    /// How long it waits before it next checks on them.
    next_check: Duration,
}

impl Idle {
    pub(crate) fn new(event_types: Option<Vec<String>>, poll_interval: Duration) -> Self {
        Idle {
            relay_id: Uuid::new_v4(),
            event_types,
            poll_interval,
            lingering_until: Instant::now(),
            registered_until: None,
            unseen: Vec::new(),
            next_check: FIRST_CHECK,
        }
    }

    /// The relay found rows: it is awake, and producers need not wake it.
    pub(crate) async fn found_work(&mut self, db: &Db) {
        self.lingering_until = Instant::now() + LINGER;
        if self.registered_until.is_some() {
            self.unregister(db).await;
        }
    }

    /// The relay found nothing: waits until it should look again.
    pub(crate) async fn wait(&mut self, db: &Db, wake: &Notify) {
        let now = Instant::now();
        if now < self.lingering_until {
            nap(wake, LINGER_POLL).await;
            return;
        }
        let Some(pool) = db.postgres() else {
            nap(wake, self.poll_interval).await;
            return;
        };
        let lapsing = self.registered_until.is_none_or(|until| until < now + self.poll_interval);
        if lapsing {
            match self.register(pool, now).await {
                // Registered: look once more before sleeping, for rows committed meanwhile.
                Ok(()) => return,
                Err(error) => {
                    tracing::warn!(error = %ErrorChain(&error), "cannot register for outbox wake-ups");
                    nap(wake, self.poll_interval).await;
                    return;
                }
            }
        }
        if self.unseen.is_empty() {
            nap(wake, self.poll_interval).await;
        } else {
            self.watch_unseen(pool, wake).await;
        }
    }

    /// Registers (or renews the registration) until `now` plus the hold. A fresh registration
    /// reads which transactions are writing events: they may have missed it.
    async fn register(&mut self, pool: &PgPool, now: Instant) -> Result<(), sqlx::Error> {
        let hold = self.poll_interval * 2 + Duration::from_secs(5);
        // Producers have seen a registration that has not lapsed all along.
        let renewing = self.registered_until.is_some_and(|until| now < until);
        let types = self.event_types.as_deref();
        store::register_sleeper(pool, self.relay_id, types, hold).await?;
        if !renewing {
            self.unseen.clear();
            self.next_check = FIRST_CHECK;
            // Registered, though not known to be seen until the read succeeds: should it fail,
            // the next wait registers afresh (and waking up still withdraws the registration).
            self.registered_until = Some(now);
            self.unseen = store::inserting_transactions(pool, None).await?;
        }
        self.registered_until = Some(now + hold);
        Ok(())
    }

    /// Waits for a NOTIFY, the poll interval, or the end of a producer that may have missed the
    /// registration, checking on those less and less often.
    async fn watch_unseen(&mut self, pool: &PgPool, wake: &Notify) {
        let until = Instant::now() + self.poll_interval;
        loop {
            let now = Instant::now();
            if now >= until || nap(wake, self.next_check.min(until - now)).await == Nap::Woken {
                return;
            }
            self.next_check =
                (self.next_check * 2).min(MOST_BETWEEN_CHECKS).min(self.poll_interval);
            match store::inserting_transactions(pool, Some(&self.unseen)).await {
                Ok(open) if open.len() < self.unseen.len() => {
                    // One ended, and its rows are visible: look for them.
                    self.unseen = open;
                    return;
                }
                Ok(_) => {}
                Err(error) => {
                    // Their rows wait for the poll interval instead, as after any missed wake-up.
                    tracing::warn!(
                        error = %ErrorChain(&error),
                        "cannot check on the producers that may have missed the outbox wake-up \
                         registration; polling for their events instead"
                    );
                    self.unseen.clear();
                    return;
                }
            }
        }
    }

    /// Withdraws the registration, if any: at shutdown, or once awake.
    pub(crate) async fn unregister(&mut self, db: &Db) {
        self.registered_until = None;
        self.unseen.clear();
        let Some(pool) = db.postgres() else { return };
        if let Err(error) = store::unregister_sleeper(pool, self.relay_id).await {
            tracing::debug!(error = %ErrorChain(&error), "cannot withdraw the outbox wake-up registration");
        }
    }
}

/// How a nap ended.
#[derive(Debug, PartialEq, Eq)]
enum Nap {
    Woken,
    Elapsed,
}

/// Sleeps for `duration` or until woken.
async fn nap(wake: &Notify, duration: Duration) -> Nap {
    tokio::select! {
        () = wake.notified() => Nap::Woken,
        () = tokio::time::sleep(duration) => Nap::Elapsed,
    }
}
