//! Why a command failed, worded for the operator reading stderr.

use std::fmt;

use outbox_runtime::SchemaVersion;
use uuid::Uuid;

/// The expected shape of a database URL, quoted in errors about it.
const URL_FORM: &str =
    "postgres://user@host:port/db (or sqlite://file.db, mysql://user@host:port/db)";

/// A failed command. Its `Display` is the whole message, without the leading `error: `.
#[derive(Debug)]
pub enum Failure {
    /// Neither `--database-url` nor `DATABASE_URL` was given.
    NoDatabaseUrl,
    /// The URL does not parse; `reason` never quotes it.
    MalformedUrl {
        /// What is wrong with it.
        reason: String,
    },
    /// A TLS file the database URL names (`sslrootcert`, `sslcert`, `sslkey`) cannot be read.
    TlsFile {
        /// Which parameter named it.
        parameter: String,
        /// The file.
        path: String,
        /// Why it cannot be read.
        reason: String,
    },
    /// The database did not accept a connection.
    Unreachable {
        /// `host:port` or the socket path.
        target: String,
        /// Why, as sqlx put it.
        reason: String,
    },
    /// `outbox.events` does not exist.
    SchemaMissing,
    /// The schema lacks migrations this version of the CLI needs.
    SchemaOutdated {
        /// The newest of them the schema has.
        applied: SchemaVersion,
        /// The newest of them it lacks.
        needed: SchemaVersion,
    },
    /// No dead event has this id.
    NoSuchDeadEvent(Uuid),
    /// No event has this id.
    NoSuchEvent(Uuid),
    /// The consumer's inbox has no dead message with this id.
    NoSuchDeadMessage {
        /// `--consumer`.
        consumer: String,
        /// The id given.
        event_id: Uuid,
    },
    /// The inbox's database failed.
    Inbox(outbox_runtime::inbox::InboxError),
    /// `--older-than` is not shorter than `--newer-than`: no instant is in both.
    EmptyRange {
        /// `--newer-than`.
        newer_than: std::time::Duration,
        /// `--older-than`.
        older_than: std::time::Duration,
    },
    /// `outbox console` was asked to serve beyond loopback without a token.
    ConsoleNeedsToken(std::net::SocketAddr),
    /// `outbox console` cannot serve on its address.
    ConsoleBind {
        /// `--bind`.
        address: std::net::SocketAddr,
        /// Why.
        reason: std::io::Error,
    },
    /// `outbox console` stopped serving on an error.
    ConsoleServe(std::io::Error),
    /// `outbox forward` cannot reach or use its broker as configured.
    Forward(String),
    /// The command needs PostgreSQL: on SQLite and MySQL the CLI runs `migrate` so far.
    PostgresOnly {
        /// The database the URL names.
        backend: &'static str,
    },
    /// Anything else the runtime reported.
    Outbox(outbox_runtime::Error),
}

impl From<outbox_runtime::Error> for Failure {
    fn from(error: outbox_runtime::Error) -> Self {
        match error {
            outbox_runtime::Error::SchemaMissing => Failure::SchemaMissing,
            outbox_runtime::Error::SchemaOutdated { applied, needed } => {
                Failure::SchemaOutdated { applied, needed }
            }
            other => Failure::Outbox(other),
        }
    }
}

impl From<outbox_runtime::inbox::InboxError> for Failure {
    fn from(error: outbox_runtime::inbox::InboxError) -> Self {
        Failure::Inbox(error)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::NoDatabaseUrl => write!(
                f,
                "no database given: pass --database-url or set DATABASE_URL (expected form: \
                 {URL_FORM})"
            ),
            Failure::MalformedUrl { reason } => {
                write!(f, "malformed database URL ({reason}); expected form: {URL_FORM}")
            }
            Failure::TlsFile { parameter, path, reason } => {
                write!(f, "cannot read {parameter} file {path}: {reason}")
            }
            Failure::Unreachable { target, reason } => {
                write!(f, "could not connect to the database at {target}: {reason}")
            }
            Failure::PostgresOnly { backend } => write!(
                f,
                "this command runs on PostgreSQL only so far; on {backend}, `outbox migrate` is \
                 the one the CLI has (the rest follow, with the relay: issue #25)"
            ),
            Failure::SchemaMissing => {
                write!(f, "the outbox schema is missing: run `outbox migrate`")
            }
            Failure::SchemaOutdated { applied, needed } => write!(
                f,
                "the outbox schema is at {applied}, but this outbox CLI needs {needed}: run \
                 `outbox migrate` (as the role that owns the schema), then this command again"
            ),
            Failure::NoSuchDeadEvent(id) => write!(f, "no dead event with id {id}"),
            Failure::NoSuchEvent(id) => write!(
                f,
                "no event with id {id}: never emitted, rolled back, or removed (by retention, \
                 delete_on_publish, or a discarded dead letter)"
            ),
            Failure::EmptyRange { newer_than, older_than } => write!(
                f,
                "--newer-than {} and --older-than {} select nothing: events of more than {} \
                 and less than {} ago; give --older-than the shorter age",
                humantime::format_duration(*newer_than),
                humantime::format_duration(*older_than),
                humantime::format_duration(*older_than),
                humantime::format_duration(*newer_than),
            ),
            Failure::ConsoleNeedsToken(address) => write!(
                f,
                "the console would serve {address}, beyond loopback, without a token: set \
                 OUTBOX_CONSOLE_TOKEN to a long random secret (`openssl rand -hex 32`), or bind \
                 127.0.0.1"
            ),
            Failure::ConsoleBind { address, reason } => {
                write!(f, "cannot serve the console on {address}: {reason}; choose another --bind")
            }
            Failure::ConsoleServe(reason) => write!(
                f,
                "the console stopped serving: {reason}; start it again (a lack of file \
                 descriptors shows as `Too many open files`: raise `ulimit -n`)"
            ),
            Failure::Forward(reason) => write!(f, "{reason}"),
            Failure::NoSuchDeadMessage { consumer, event_id } => write!(
                f,
                "consumer `{consumer}` has no dead message with id {event_id} (`outbox inbox dead \
                 --consumer {consumer}` lists them)"
            ),
            Failure::Inbox(error) => {
                write!(f, "{error}")?;
                let mut source = std::error::Error::source(error);
                while let Some(cause) = source {
                    write!(f, ": {cause}")?;
                    source = cause.source();
                }
                Ok(())
            }
            Failure::Outbox(error) => {
                // The outbox's errors keep their cause as `source`: print the whole chain.
                write!(f, "{error}")?;
                let mut source = std::error::Error::source(error);
                while let Some(cause) = source {
                    write!(f, ": {cause}")?;
                    source = cause.source();
                }
                Ok(())
            }
        }
    }
}
