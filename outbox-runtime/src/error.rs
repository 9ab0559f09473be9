//! The crate's error types.

/// An error from emitting events, migrating, or running the relay.
///
/// Each variant's message says what failed; the underlying error is its
/// [`source`](std::error::Error::source), not repeated in the message, so error-chain printers
/// (`anyhow`'s `{:#}`, `tracing`'s error fields) show it once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The database refused a statement or could not be reached.
    #[error("outbox database error")]
    Database(#[source] sqlx::Error),

    /// Applying the outbox migrations failed.
    #[error("outbox migration failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),

    /// The `outbox.events` table does not exist: run [`migrate`](crate::migrate) first.
    #[error("the outbox schema is missing: run `outbox_runtime::migrate` first")]
    SchemaMissing,

    /// The outbox schema lacks migrations this version of the crate needs: it was migrated by
    /// an older version, or not since this one was deployed. Checked by
    /// [`check_schema`](crate::check_schema), which the relay runs before it leases anything and
    /// the `outbox` CLI before every command but `migrate`: without it, every statement using a
    /// newer column would fail and be retried without end.
    ///
    /// A schema with migrations *newer* than this version knows is accepted: that is a rolling
    /// deploy in which a newer version migrated first, and the outbox's migrations only add
    /// (columns with defaults, indexes, functions), so an older relay keeps working on it. A
    /// release whose migration breaks older versions will say so in the changelog.
    #[error(
        "the outbox schema is at {applied}, but this version of outbox_runtime needs {needed}:          apply its migrations with `outbox_runtime::migrate` (or `outbox migrate`), then start          again"
    )]
    SchemaOutdated {
        /// The newest of this version's migrations that the schema has.
        applied: crate::SchemaVersion,
        /// The newest of this version's migrations that the schema lacks.
        needed: crate::SchemaVersion,
    },

    /// The role may not read the outbox's migration history, so
    /// [`check_schema`](crate::check_schema) cannot tell whether the schema is recent enough.
    /// The relay refuses to start rather than guess: grant the role SELECT on the history's
    /// `version` and `success` columns (`docs/least-privilege.sql` does, in its `objects` step).
    #[error(
        "cannot check the outbox schema's migrations: role {role} may not read {table}; grant          it with `GRANT SELECT (version, success) ON {table} TO {role}` (as in the `objects`          step of docs/least-privilege.sql)"
    )]
    MigrationsUnreadable {
        /// The role, as SQL names it (quoted if it needs to be).
        role: String,
        /// The history table: `outbox._sqlx_migrations`, or `_sqlx_migrations` when the
        /// migrations went through [`with_outbox_migrations`](crate::with_outbox_migrations).
        table: &'static str,
        /// The database's refusal.
        #[source]
        cause: sqlx::Error,
    },

    /// The relay's forwarding sink is not set up to take its messages (broker unreachable, no
    /// stream or exchange): checked before the relay starts.
    #[error("the forwarding sink is not ready")]
    Sink(#[source] crate::forward::SinkError),

    /// The relay's connections do not keep their session between transactions: they go through
    /// a pooler in transaction or statement mode, such as PgBouncer with
    /// `pool_mode = transaction`. The relay's session settings and LISTEN would apply to
    /// whichever server connection ran them, and its statements could run as other clients'.
    /// Checked when the relay starts, before it leases anything.
    #[error(
        "the relay's connections do not keep their session: they go through a pooler in \
         transaction or statement mode (such as PgBouncer with `pool_mode = transaction`); \
         connect the relay directly to PostgreSQL, or through a session-mode pool"
    )]
    TransactionPooling,

    /// An event could not be stored; nothing was written.
    #[error("cannot emit `{event_type}` event")]
    InvalidEvent {
        /// The event type of the rejected event.
        event_type: &'static str,
        /// Why it was rejected.
        #[source]
        reason: InvalidEvent,
    },
}

/// SQLSTATE `undefined_table`: what PostgreSQL answers when `outbox.events` does not exist.
const UNDEFINED_TABLE: &str = "42P01";

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        match &error {
            sqlx::Error::Database(db) if db.code().as_deref() == Some(UNDEFINED_TABLE) => {
                Error::SchemaMissing
            }
            _ => Error::Database(error),
        }
    }
}

/// Why an event was rejected by `emit` before anything was written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidEvent {
    /// The payload did not serialize to JSON (for example a map with non-string keys).
    #[error("payload does not serialize to JSON")]
    Serialize(#[source] serde_json::Error),
    /// The payload holds a NaN or infinite float, which JSON cannot represent
    /// (`serde_json` would silently write `null`).
    #[error("payload holds a non-finite float ({0}), which JSON cannot represent")]
    NonFiniteFloat(f64),
    /// A string in the payload, the aggregate id or a header holds a NUL character, which
    /// PostgreSQL `text` and `jsonb` cannot store.
    #[error("{0} holds a NUL character, which PostgreSQL cannot store")]
    NulCharacter(&'static str),
    /// The aggregate id or the idempotency key is longer than the backend's schema holds
    /// (255 characters on MySQL and MariaDB; PostgreSQL and SQLite have no limit).
    #[error("{what} is {length} characters long; this database's outbox holds at most {limit}")]
    TooLong {
        /// What is too long: `"the aggregate id"` or `"the idempotency key"`.
        what: &'static str,
        /// Its length, in characters.
        length: usize,
        /// The longest the backend holds.
        limit: usize,
    },
    /// The payload or a header nests arrays and objects deeper than the relay can decode
    /// (`serde_json`'s deserializer refuses more than 127 levels, the outermost object counting
    /// as one), whatever the handler's type would have skipped.
    #[error("{what} nests arrays and objects {depth} deep; the relay decodes at most {limit}")]
    TooDeep {
        /// What is nested too deep: `"the payload"` or `"a header"`.
        what: &'static str,
        /// How deep it nests.
        depth: usize,
        /// The deepest nesting the relay decodes.
        limit: usize,
    },
}

/// A boxed error, as handlers return.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Whether a database error is the database's unavailability (no connection to be had, the
/// connection lost, the server shutting down or out of resources) rather than a statement's
/// refusal: what the relay never counts against an event.
pub(crate) fn is_unavailable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        // Class 08: connection exceptions; 53: insufficient resources (too many connections,
        // out of memory, disk full); 57P01 to 57P03: shutting down, or not accepting
        // connections yet.
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || code.starts_with("53")
                || matches!(&*code, "57P01" | "57P02" | "57P03")
        }),
        _ => false,
    }
}

/// Shows an error with its whole chain of causes, `error: cause: cause`, like anyhow's `{:#}`:
/// what log lines print, so the cause (`terminating connection due to administrator command`)
/// is never left in `source()` only.
pub(crate) struct ErrorChain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut last = self.0.to_string();
        f.write_str(&last)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            // Some errors (sqlx's among them) end their own message with their source's: each
            // text is printed once.
            let text = cause.to_string();
            if !last.ends_with(&text) {
                write!(f, ": {text}")?;
            }
            last = text;
            source = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_shows_every_cause_once() {
        let io = std::io::Error::other("terminating connection due to administrator command");
        let error = Error::Database(sqlx::Error::Io(io));
        assert_eq!(
            ErrorChain(&error).to_string(),
            "outbox database error: error communicating with database: terminating connection \
             due to administrator command"
        );
    }
}
