//! The relay's entry in `outbox.relays` (see `crate::relays`): written at start, refreshed by a
//! heartbeat with the rows it holds and the events it delivered, removed when it stops. It is for
//! operators: failing to write it is logged and never stops the relay.

use sqlx::PgPool;
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::error::{Error, ErrorChain};
use crate::relay::held::HeldRows;
use crate::relay::metrics::RelayMetrics;
use crate::relays::{FORGET_AFTER, HEARTBEAT_INTERVAL};
use crate::store::{self, RelayEntry};

/// What a relay says of itself, decided when it was built.
#[derive(Debug, Clone)]
pub(crate) struct Registration {
    pub(crate) lease_mode: &'static str,
    pub(crate) handles: Vec<String>,
    pub(crate) forwards: Option<Vec<String>>,
}

/// Keeps the relay's entry until `stop` fires or is dropped, then removes it.
pub(crate) async fn keep_registered(
    pool: PgPool,
    registration: Registration,
    held: HeldRows,
    metrics: RelayMetrics,
    mut stop: oneshot::Receiver<()>,
) {
    let entry = RelayEntry {
        relay_id: Uuid::new_v4(),
        host: gethostname::gethostname().to_string_lossy().into_owned(),
        pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
        version: env!("CARGO_PKG_VERSION"),
        lease_mode: registration.lease_mode,
        handles: registration.handles,
        forwards: registration.forwards,
    };
    if let Err(error) = store::forget_silent(&pool, FORGET_AFTER).await {
        warn(&error.into(), "cannot remove the entries of relays silent for a day");
    }
    let mut beats = tokio::time::interval(HEARTBEAT_INTERVAL);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = beats.tick() => {
                let delivered = metrics.counts().delivered;
                if let Err(error) = store::heartbeat(&pool, &entry, held.get(), delivered).await {
                    warn(&error.into(), "cannot write its heartbeat to outbox.relays");
                }
            }
        }
    }
    if let Err(error) = store::withdraw(&pool, entry.relay_id).await {
        warn(&error.into(), "cannot remove its entry from outbox.relays");
    }
}

fn warn(error: &Error, what: &str) {
    tracing::warn!(
        error = %ErrorChain(error),
        "outbox relay {what}; delivery goes on, and `outbox status` shows the relay as silent \
         until a heartbeat succeeds (if permission is denied, grant the relay's role SELECT, \
         INSERT, UPDATE, DELETE on outbox.relays: docs/least-privilege.sql)"
    );
}
