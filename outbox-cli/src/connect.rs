//! From a database URL to a pool, with errors that say what went wrong and never echo the URL
//! (it may hold a password).
//!
//! TLS is sqlx's, over rustls, as the URL asks: `sslmode=disable | prefer` (the default: TLS if
//! the server offers it, unverified) ` | require` (TLS or no connection, unverified) ` |
//! verify-ca` (the certificate must chain to a trusted root) ` | verify-full` (and name the
//! host); `sslrootcert=` a PEM file of roots added to the Mozilla roots; `sslcert=` and
//! `sslkey=` a client certificate and its key. A mode that asks for TLS never falls back to
//! plain text.

use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

use crate::error::Failure;
use crate::percent;

/// How long to wait for the database before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The outbox's database, as the URL's scheme names it.
pub enum Database {
    /// `postgres://`: every command.
    Postgres(PgPool),
    /// `sqlite://`: `migrate` so far.
    Sqlite(SqlitePool),
    /// `mysql://` (MySQL or MariaDB): `migrate` so far.
    MySql(MySqlPool),
}

impl Database {
    pub async fn close(&self) {
        match self {
            Database::Postgres(pool) => pool.close().await,
            Database::Sqlite(pool) => pool.close().await,
            Database::MySql(pool) => pool.close().await,
        }
    }
}

/// Parses `url` and connects to the database it names.
pub async fn connect(url: Option<&str>) -> Result<Database, Failure> {
    let url = url.filter(|url| !url.trim().is_empty()).ok_or(Failure::NoDatabaseUrl)?;
    match url.split_once("://").map(|(scheme, _)| scheme) {
        Some("sqlite") => connect_sqlite(url).await.map(Database::Sqlite),
        Some("mysql" | "mariadb") => connect_mysql(url).await.map(Database::MySql),
        _ => connect_postgres(url).await.map(Database::Postgres),
    }
}

/// A SQLite file (`sqlite://path`, `?mode=rwc` to create it). Its path is no secret.
async fn connect_sqlite(url: &str) -> Result<SqlitePool, Failure> {
    let options = SqliteConnectOptions::from_str(url)
        .map_err(|error| Failure::MalformedUrl { reason: configuration(&error) })?;
    let target = options.get_filename().display().to_string();
    SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(|error| Failure::Unreachable {
            target,
            reason: format!(
                "{} (does its directory exist? `?mode=rwc` creates a missing file)",
                reason(&error)
            ),
        })
}

/// A MySQL or MariaDB server (`mysql://user@host:port/db`; `mariadb://` is read as `mysql://`).
/// As with PostgreSQL, what an error quotes of the URL is checked with the password redacted.
async fn connect_mysql(url: &str) -> Result<MySqlPool, Failure> {
    let url = url.strip_prefix("mariadb").map_or(url.to_owned(), |rest| format!("mysql{rest}"));
    let rest = &url["mysql://".len()..];
    if let Err(error) = MySqlConnectOptions::from_str(&redacted("mysql", rest, &url)) {
        return Err(Failure::MalformedUrl { reason: configuration(&error) });
    }
    let options = MySqlConnectOptions::from_str(&url).map_err(|_| Failure::MalformedUrl {
        reason: "the password is not valid percent-encoded UTF-8".to_owned(),
    })?;
    let target = format!("{}:{}", options.get_host(), options.get_port());
    let unreachable = |reason| Failure::Unreachable { target: target.clone(), reason };
    // A probe first, as for PostgreSQL: it says why a connection fails, the pool only that it
    // timed out.
    let probe = tokio::time::timeout(CONNECT_TIMEOUT, options.connect())
        .await
        .map_err(|_| unreachable(format!("no answer within {CONNECT_TIMEOUT:?}")))?
        .map_err(|error| unreachable(reason(&error)))?;
    let _ = probe.close().await;
    MySqlPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(|error| unreachable(reason(&error)))
}

/// The URL `scheme://rest` with the password, if any, replaced by `redacted`.
fn redacted(scheme: &str, rest: &str, url: &str) -> String {
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    match authority.rsplit_once('@') {
        Some((userinfo, _)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:redacted@{}", &rest[userinfo.len() + 1..])
        }
        _ => url.to_owned(),
    }
}

/// A configuration error's text, without sqlx's prefix.
fn configuration(error: &sqlx::Error) -> String {
    error.to_string().trim_start_matches("error with configuration: ").to_owned()
}

/// Parses a `postgres://` URL and connects to it.
async fn connect_postgres(url: &str) -> Result<PgPool, Failure> {
    let options = parse(url)?;
    // One connection first, outside the pool: the pool retries a refused connection until its
    // timeout and then reports only the timeout, while this reports why.
    let probe = tokio::time::timeout(CONNECT_TIMEOUT, options.connect())
        .await
        .map_err(|_| unreachable(&options, format!("no answer within {CONNECT_TIMEOUT:?}")))?
        .map_err(|error| unreachable(&options, reason(&error)))?;
    // Closing it politely is a courtesy to the server; a failure here changes nothing.
    let _ = probe.close().await;
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options.clone())
        .await
        .map_err(|error| unreachable(&options, reason(&error)))
}

/// Why a connection failed, with the whole chain of causes. A TLS failure says so first, and a
/// certificate that did not verify says that: sqlx reports rustls's `invalid peer certificate:
/// UnknownIssuer` as an I/O error "communicating with database".
fn reason(error: &sqlx::Error) -> String {
    let mut text = error.to_string();
    let mut last = text.clone();
    let mut tls = matches!(error, sqlx::Error::Tls(_)).then_some(false);
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        // sqlx ends some messages with their source's: each text is printed once.
        let cause_text = cause.to_string();
        if !last.ends_with(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        // An io::Error's `source` is its inner error's source, not the inner error.
        let inner = cause.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref());
        let rustls = inner.and_then(|inner| inner.downcast_ref::<rustls::Error>());
        if let Some(rustls) = rustls.or_else(|| cause.downcast_ref::<rustls::Error>()) {
            tls = Some(matches!(rustls, rustls::Error::InvalidCertificate(_)));
        }
        last = cause_text;
        source = cause.source();
    }
    match tls {
        Some(true) => {
            format!("TLS failed: the server's certificate could not be verified ({text})")
        }
        Some(false) => format!("TLS failed ({text})"),
        None => text,
    }
}

/// Parses a `postgres://` URL. Errors name the expected form and never the password.
fn parse(url: &str) -> Result<PgConnectOptions, Failure> {
    let malformed = |reason: &str| Failure::MalformedUrl { reason: reason.to_owned() };
    let Some(("postgres" | "postgresql", rest)) = url.split_once("://") else {
        return Err(malformed(
            "it must start with postgres://, postgresql://, sqlite:// or mysql://",
        ));
    };
    // sqlx's messages can quote parts of the URL (a query value), so the URL is first checked
    // with its password replaced: whatever that reports cannot hold the password.
    if let Err(error) = PgConnectOptions::from_str(&redacted("postgres", rest, url)) {
        return Err(malformed(&configuration(&error)));
    }
    let options = PgConnectOptions::from_str(url)
        .map_err(|_| malformed("the password is not valid percent-encoded UTF-8"))?;
    readable_tls_files(rest)?;
    Ok(options)
}

/// The files `sslrootcert`, `sslcert` and `sslkey` name must be readable: sqlx reads them only
/// when it upgrades the connection, and reports a missing one as an I/O error "communicating
/// with database". A file path is no secret, so it is named.
fn readable_tls_files(rest: &str) -> Result<(), Failure> {
    let query = rest.split_once('?').map_or("", |(_, query)| query);
    let query = query.split('#').next().unwrap_or("");
    for pair in query.split('&') {
        let Some((key, value)) = pair.split_once('=') else { continue };
        if !matches!(key, "sslrootcert" | "sslcert" | "sslkey") {
            continue;
        }
        let path = percent::decoded(value, true);
        if let Err(error) = std::fs::File::open(&path) {
            return Err(Failure::TlsFile {
                parameter: key.to_owned(),
                path,
                reason: error.to_string(),
            });
        }
    }
    Ok(())
}

fn unreachable(options: &PgConnectOptions, reason: String) -> Failure {
    let target = match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    Failure::Unreachable { target, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_other_schemes_and_bad_urls_without_echoing_them() {
        for url in [
            "mysql://u:hunter2@h/db",
            "hunter2",
            "postgres://u:hunter2@h:port/db",
            "postgres://u:hunter2@h/db?sslmode=bogus",
            "postgres://u:hunter2%FF@h/db",
        ] {
            let message = parse(url).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(message.contains("malformed database URL"), "{url}: {message}");
            assert!(!message.contains("hunter2"), "{url}: {message}");
        }
    }

    #[test]
    fn names_a_tls_file_it_cannot_read() {
        let url = "postgres://u:hunter2@h/db?sslmode=verify-full&sslrootcert=%2Fno%2Fsuch%20ca.pem";
        let message = parse(url).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.starts_with("cannot read sslrootcert file /no/such ca.pem: "), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
    }

    #[test]
    fn accepts_postgres_urls() {
        let options = parse("postgresql://u@db.internal:6543/app").expect("valid");
        assert_eq!((options.get_host(), options.get_port()), ("db.internal", 6543));
        let options = parse("postgres://u:p%40ss:w@h/app?sslmode=disable").expect("valid");
        assert_eq!((options.get_username(), options.get_database()), ("u", Some("app")));
    }
}
