//! The relay's own connections, apart from the builder's pool: handlers busy on that pool (or
//! starved by it) cannot delay a lease renewal past its deadline.
//!
//! They must each keep one session for their lifetime: the statements rely on the session's
//! settings ([`store::RELAY_SESSION`]) and on prepared statements, and the listener on LISTEN.
//! A pooler in transaction (or statement) mode, such as PgBouncer with
//! `pool_mode = transaction`, lends a server connection for one transaction only, so a session
//! setting lands on whichever server connection ran it (and then applies to another client's
//! transactions there), and a statement prepared outside a transaction can be bound on another
//! server connection, to another client's statement of the same name. So before opening them
//! the relay checks ([`check_sessions`]) that the connections its connect options make keep
//! their session, and refuses to start with [`Error::TransactionPooling`] otherwise.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection, PgPool};

use crate::error::{Error, ErrorChain};
use crate::relay::config::LeaseMode;
use crate::relay::held_transaction::BATCHES_IN_FLIGHT;
use crate::store::{self, Db};

/// Rounds of the check. A pooler that hands server connections round lends the first
/// connection's backend to the second, or a new one to the first, in the first round, whether it
/// reuses the last one released (PgBouncer's default) or the oldest (`server_round_robin`);
/// the others are for pools busy with other clients' transactions.
const CHECK_ROUNDS: usize = 3;

/// How long the check may take: it connects twice and runs a dozen trivial statements, but a
/// connection attempt to an unreachable host can hang for minutes.
const CHECK_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) struct Connections {
    /// The lease statement's, the drain's bound (one per batch in flight for a relay that holds
    /// its rows in transactions).
    pub(crate) lease: Db,
    /// Acknowledgements and renewals (up to four at once), retention, gauges, wake-up
    /// registrations and the listener's check.
    pub(crate) relay: Db,
    /// LISTEN for new events, on PostgreSQL.
    pub(crate) listen: Option<PgPool>,
}

impl Connections {
    /// Opens them lazily with `pool`'s connect options.
    ///
    /// Named, so operators (and tests) can find them in `pg_stat_activity`. No ping before each
    /// statement (sqlx's default): it doubles the round trips of the lease, and a broken
    /// connection fails the statement anyway, which the relay retries. Every statement reuses
    /// one plan made to be safe whatever the table's statistics ([`store::RELAY_SESSION`]), set
    /// after connecting: poolers such as PgBouncer refuse such startup options. The LISTEN
    /// connection runs no statement but LISTEN, so it needs no settings.
    ///
    /// A relay that holds its rows in transactions ([`LeaseMode::HeldTransaction`]) gets a
    /// lease connection per batch in flight, on which the server ends a transaction that waits
    /// longer than the lease timeout for its next statement: so the rows of a relay that stopped
    /// answering come free.
    ///
    /// On SQLite the relay uses the application's pool: the database takes one writer at a
    /// time whatever the pool, and a `sqlite::memory:` database exists only for that pool's
    /// connections.
    pub(crate) fn open(db: &Db, lease_mode: LeaseMode, lease_timeout: Duration) -> Self {
        match db {
            Db::Postgres(pool) => Self::postgres(pool, lease_mode, lease_timeout),
            #[cfg(feature = "sqlite")]
            Db::Sqlite(_) => Connections { lease: db.clone(), relay: db.clone(), listen: None },
            #[cfg(feature = "mysql")]
            Db::MySql(pool) => Self::mysql(pool),
        }
    }

    /// On MySQL: one connection to lease, four for the rest, in `READ COMMITTED`, where a
    /// locking read takes no gap locks (which would hold back producers' inserts).
    #[cfg(feature = "mysql")]
    fn mysql(pool: &sqlx::MySqlPool) -> Self {
        let statements = |connections| {
            sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(connections)
                .test_before_acquire(false)
                .after_connect(|conn, _| {
                    Box::pin(async move {
                        conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                            .await?;
                        Ok(())
                    })
                })
                .connect_lazy_with((*pool.connect_options()).clone())
        };
        Connections {
            lease: Db::MySql(statements(1)),
            relay: Db::MySql(statements(4)),
            listen: None,
        }
    }

    fn postgres(pool: &PgPool, lease_mode: LeaseMode, lease_timeout: Duration) -> Self {
        let options = |name| (*pool.connect_options()).clone().application_name(name);
        let statements = |connections, name, idle_in_transaction: Option<Duration>| {
            PgPoolOptions::new()
                .max_connections(connections)
                .test_before_acquire(false)
                .after_connect(move |conn, _| {
                    Box::pin(async move {
                        conn.execute(store::RELAY_SESSION).await?;
                        if let Some(timeout) = idle_in_transaction {
                            store::set_idle_in_transaction_timeout(conn, timeout).await?;
                        }
                        Ok(())
                    })
                })
                .connect_lazy_with(options(name))
        };
        let (lease, idle_in_transaction) = match lease_mode {
            LeaseMode::Written => (1, None),
            LeaseMode::HeldTransaction => (BATCHES_IN_FLIGHT, Some(lease_timeout)),
        };
        Connections {
            lease: Db::Postgres(statements(lease, "outbox-relay-lease", idle_in_transaction)),
            relay: Db::Postgres(statements(4, "outbox-relay", None)),
            listen: Some(
                PgPoolOptions::new()
                    .max_connections(1)
                    .test_before_acquire(false)
                    .connect_lazy_with(options("outbox-relay-listen")),
            ),
        }
    }

    /// Closes the statement connections (the listener's goes with its task); on SQLite,
    /// nothing: they are the application's.
    pub(crate) async fn close(&self) {
        for db in [&self.lease, &self.relay] {
            match db {
                Db::Postgres(pool) => pool.close().await,
                #[cfg(feature = "sqlite")]
                Db::Sqlite(_) => {}
                #[cfg(feature = "mysql")]
                Db::MySql(pool) => pool.close().await,
            }
        }
    }
}

/// Waits until it can tell whether connections made with `pool`'s connect options keep their
/// session; [`Error::TransactionPooling`] if they do not. While the database cannot be reached
/// it retries, as the relay does every statement. Only PostgreSQL is reached through poolers.
pub(crate) async fn check_sessions(db: &Db) -> Result<(), Error> {
    let Some(pool) = db.postgres() else { return Ok(()) };
    let options = (*pool.connect_options()).clone().application_name("outbox-relay-check");
    let mut retry = Duration::from_millis(100);
    loop {
        match tokio::time::timeout(CHECK_TIMEOUT, sessions_kept(&options)).await {
            Ok(Ok(true)) => return Ok(()),
            Ok(Ok(false)) => return Err(Error::TransactionPooling),
            Ok(Err(error)) => {
                tracing::warn!(error = %ErrorChain(&error), retry_in = ?retry, "cannot check the outbox relay's connections")
            }
            Err(_) => tracing::warn!(
                retry_in = ?retry,
                "cannot check the outbox relay's connections: no answer within {CHECK_TIMEOUT:?}"
            ),
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(Duration::from_secs(10));
    }
}

/// Whether two connections kept one backend each. In a session they cannot share one, and
/// neither can change its own; a pooler in transaction mode lends a backend per transaction,
/// so within a few rounds the second gets the first's (which the first released), or the first
/// a new one. Only the backends' ids are compared: nothing is set, so nothing is left behind on
/// a server connection other clients go on to use.
async fn sessions_kept(options: &PgConnectOptions) -> Result<bool, sqlx::Error> {
    let mut first = PgConnection::connect_with(options).await?;
    let mut second = match PgConnection::connect_with(options).await {
        Ok(second) => second,
        Err(error) => {
            let _ = first.close().await;
            return Err(error);
        }
    };
    let kept = async {
        for _ in 0..CHECK_ROUNDS {
            let before = store::backend_pid(&mut first).await?;
            let other = store::backend_pid(&mut second).await?;
            let after = store::backend_pid(&mut first).await?;
            let again = store::backend_pid(&mut first).await?;
            if other == before || after != before || again != before {
                tracing::debug!(
                    before,
                    other,
                    after,
                    again,
                    "the outbox relay's connections change backends between transactions"
                );
                return Ok(false);
            }
        }
        Ok(true)
    }
    .await;
    // Best effort: the connections are dropped either way.
    let _ = first.close().await;
    let _ = second.close().await;
    kept
}
