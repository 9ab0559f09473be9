//! The relay's own connections, apart from the builder's pool: handlers busy on that pool (or
//! starved by it) cannot delay a lease renewal past its deadline.

use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool};

use crate::store;

pub(crate) struct Connections {
    /// The lease statement's, the drain's bound.
    pub(crate) lease: PgPool,
    /// Acknowledgements and renewals (up to four at once), retention, gauges, wake-up
    /// registrations.
    pub(crate) relay: PgPool,
    /// LISTEN for new events.
    pub(crate) listen: PgPool,
}

impl Connections {
    /// Opens them lazily with `pool`'s connect options.
    ///
    /// Named, so operators (and tests) can find them in `pg_stat_activity`. No ping before each
    /// statement (sqlx's default): it doubles the round trips of the lease, and a broken
    /// connection fails the statement anyway, which the relay retries. Every statement reuses
    /// one plan made to be safe whatever the table's statistics ([`store::RELAY_SESSION`]), set
    /// after connecting: poolers such as PgBouncer refuse such startup options.
    pub(crate) fn open(pool: &PgPool) -> Self {
        let open = |connections, name| {
            let options = (*pool.connect_options()).clone().application_name(name);
            PgPoolOptions::new()
                .max_connections(connections)
                .test_before_acquire(false)
                .after_connect(|conn, _| {
                    Box::pin(async move {
                        conn.execute(store::RELAY_SESSION).await?;
                        Ok(())
                    })
                })
                .connect_lazy_with(options)
        };
        Connections {
            lease: open(1, "outbox-relay-lease"),
            relay: open(4, "outbox-relay"),
            listen: open(1, "outbox-relay-listen"),
        }
    }

    /// Closes the statement connections (the listener's goes with its task).
    pub(crate) async fn close(&self) {
        self.lease.close().await;
        self.relay.close().await;
    }
}
