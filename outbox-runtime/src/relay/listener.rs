//! Wake-ups: LISTEN for the insert trigger's NOTIFY, reconnecting whenever the connection drops.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::Notify;

use crate::store::NOTIFY_CHANNEL;

/// Runs until cancelled, waking the relay on every notification and after every reconnect
/// (notifications sent while disconnected are lost, so the relay must look for itself).
pub(crate) async fn listen(pool: PgPool, wake: Arc<Notify>) {
    let mut retry = Duration::from_millis(100);
    loop {
        match subscribe(&pool).await {
            Ok(mut listener) => {
                retry = Duration::from_millis(100);
                wake.notify_one();
                loop {
                    match listener.try_recv().await {
                        Ok(Some(_)) => wake.notify_one(),
                        // The connection dropped; the next try_recv reconnects and re-LISTENs.
                        Ok(None) => {
                            tracing::debug!("outbox LISTEN connection lost, reconnecting");
                            wake.notify_one();
                        }
                        Err(error) => {
                            tracing::warn!(%error, "outbox LISTEN connection failed");
                            break;
                        }
                    }
                }
            }
            Err(error) => {
                tracing::warn!(%error, "cannot LISTEN for outbox events; polling meanwhile")
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
