//! From a database URL to a pool, with errors that say what went wrong and never echo the URL
//! (it may hold a password).

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

use crate::error::Failure;

/// How long to wait for the database before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Parses `url` and connects to it.
pub async fn connect(url: Option<&str>) -> Result<PgPool, Failure> {
    let url = url.filter(|url| !url.trim().is_empty()).ok_or(Failure::NoDatabaseUrl)?;
    let options = parse(url)?;
    // One connection first, outside the pool: the pool retries a refused connection until its
    // timeout and then reports only the timeout, while this reports why.
    let probe = tokio::time::timeout(CONNECT_TIMEOUT, options.connect())
        .await
        .map_err(|_| unreachable(&options, format!("no answer within {CONNECT_TIMEOUT:?}")))?
        .map_err(|error| unreachable(&options, error.to_string()))?;
    // Closing it politely is a courtesy to the server; a failure here changes nothing.
    let _ = probe.close().await;
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options.clone())
        .await
        .map_err(|error| unreachable(&options, error.to_string()))
}

/// Parses a `postgres://` URL. Errors name the expected form and never the password.
fn parse(url: &str) -> Result<PgConnectOptions, Failure> {
    let malformed = |reason: &str| Failure::MalformedUrl { reason: reason.to_owned() };
    let Some(("postgres" | "postgresql", rest)) = url.split_once("://") else {
        return Err(malformed("it must start with postgres:// or postgresql://"));
    };
    // sqlx's messages can quote parts of the URL (a query value), so the URL is first checked
    // with its password replaced: whatever that reports cannot hold the password.
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let redacted = match authority.rsplit_once('@') {
        Some((userinfo, _)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("postgres://{user}:redacted@{}", &rest[userinfo.len() + 1..])
        }
        _ => url.to_owned(),
    };
    if let Err(error) = PgConnectOptions::from_str(&redacted) {
        let reason = error.to_string();
        return Err(malformed(reason.trim_start_matches("error with configuration: ")));
    }
    PgConnectOptions::from_str(url)
        .map_err(|_| malformed("the password is not valid percent-encoded UTF-8"))
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
    fn accepts_postgres_urls() {
        let options = parse("postgresql://u@db.internal:6543/app").expect("valid");
        assert_eq!((options.get_host(), options.get_port()), ("db.internal", 6543));
        let options = parse("postgres://u:p%40ss:w@h/app?sslmode=disable").expect("valid");
        assert_eq!((options.get_username(), options.get_database()), ("u", Some("app")));
    }
}
