//! The leases a relay holds, from lease to acknowledgement: renewed while held, and their
//! deliveries cancelled as soon as a lease can no longer be vouched for, so that no other relay
//! ever delivers a row while this one still does.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sqlx::PgPool;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use uuid::Uuid;

use crate::store;

#[derive(Debug, Clone, Default)]
pub(crate) struct Held(Arc<Mutex<HashMap<Uuid, Lease>>>);

#[derive(Debug)]
struct Lease {
    /// The row's current lease token.
    token: Uuid,
    /// The token of the lease the delivery started under. It differs from `token` only if this
    /// relay leased the row again while delivering it (after a slow renewal): the delivery
    /// then acknowledges under the new lease.
    delivery_token: Uuid,
    /// When the database last confirmed the lease (lease or renewal statement sent): the
    /// lease is certainly valid until this plus the lease timeout.
    confirmed_at: Instant,
    /// The running delivery, once started.
    delivery: Option<AbortHandle>,
}

impl Held {
    /// Records a lease sent at `leased_at`. Returns false if the row is already held here
    /// (its previous lease expired under a slow renewal and this relay took it again): the new
    /// token replaces the old one, and the delivery already under way acknowledges with it.
    pub(crate) fn lease(&self, event_id: Uuid, token: Uuid, leased_at: Instant) -> bool {
        let mut held = self.lock();
        if let Some(lease) = held.get_mut(&event_id) {
            lease.token = token;
            lease.confirmed_at = leased_at;
            return false;
        }
        let lease = Lease { token, delivery_token: token, confirmed_at: leased_at, delivery: None };
        held.insert(event_id, lease);
        true
    }

    /// Whether the row leased under `token` is still held under that lease and certainly
    /// valid, so its delivery may start.
    pub(crate) fn is_valid(&self, event_id: Uuid, token: Uuid, lease_timeout: Duration) -> bool {
        self.lock().get(&event_id).is_some_and(|lease| {
            lease.delivery_token == token && lease.confirmed_at.elapsed() < lease_timeout
        })
    }

    pub(crate) fn started(&self, event_id: Uuid, delivery: AbortHandle) {
        if let Some(lease) = self.lock().get_mut(&event_id) {
            lease.delivery = Some(delivery);
        }
    }

    /// The token a delivery that started under `token` acknowledges with: the row's current
    /// one while this relay still holds the row for that delivery, else its own (which the
    /// database then refuses if the row was leased again).
    pub(crate) fn current_token(&self, event_id: Uuid, token: Uuid) -> Uuid {
        match self.lock().get(&event_id) {
            Some(lease) if lease.delivery_token == token => lease.token,
            _ => token,
        }
    }

    /// Stops holding a row whose delivery (started under `token`) ended, before its outcome is
    /// written; returns the token to write it under (see [`Held::current_token`]). A delivery
    /// given up earlier leaves a newer lease of the same row alone.
    pub(crate) fn settle(&self, event_id: Uuid, token: Uuid) -> Uuid {
        let mut held = self.lock();
        match held.get(&event_id) {
            Some(lease) if lease.delivery_token == token => {
                let current = lease.token;
                held.remove(&event_id);
                current
            }
            _ => token,
        }
    }

    /// Cancels the deliveries of leases that are gone: `lost` ones the database refused to
    /// renew, and any not confirmed within a lease timeout (the database was unreachable).
    /// Returns how many were given up.
    fn give_up(&self, lost: &HashSet<(Uuid, Uuid)>, lease_timeout: Duration) -> usize {
        let mut held = self.lock();
        let before = held.len();
        held.retain(|&event_id, lease| {
            let gone = lost.contains(&(event_id, lease.token))
                || lease.confirmed_at.elapsed() >= lease_timeout;
            if gone {
                if let Some(delivery) = &lease.delivery {
                    delivery.abort();
                }
            }
            !gone
        });
        before - held.len()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Uuid, Lease>> {
        // Every operation leaves the map consistent, so a panic elsewhere cannot corrupt it.
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Renews the leases of held rows (the acknowledger calls this every third of the lease
/// timeout, between its writes), and gives up those that are lost or can no longer be
/// confirmed.
pub(crate) async fn renew_leases(pool: &PgPool, held: &Held, lease_timeout: Duration) {
    let (ids, tokens): (Vec<Uuid>, Vec<Uuid>) =
        held.lock().iter().map(|(id, lease)| (*id, lease.token)).unzip();
    let mut lost = HashSet::new();
    if !ids.is_empty() {
        let sent_at = Instant::now();
        match store::renew(pool, &ids, &tokens, lease_timeout).await {
            Ok(renewed) => {
                let renewed: HashSet<Uuid> = renewed.into_iter().collect();
                let mut current = held.lock();
                for (id, token) in ids.into_iter().zip(tokens) {
                    match current.get_mut(&id) {
                        Some(lease) if lease.token == token && renewed.contains(&id) => {
                            lease.confirmed_at = sent_at;
                        }
                        Some(lease) if lease.token == token => {
                            lost.insert((id, token));
                        }
                        _ => {} // acknowledged or re-leased meanwhile
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "cannot renew outbox leases"),
        }
    }
    let given_up = held.give_up(&lost, lease_timeout);
    if given_up > 0 {
        tracing::warn!(
            given_up,
            "outbox leases lost or unconfirmed for a whole lease timeout; \
                 cancelled their deliveries so no two relays deliver one row at once"
        );
    }
}
