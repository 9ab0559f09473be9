//! `outbox`: operate a transactional outbox from the shell.
//!
//! ```text
//! outbox migrate                                  create or upgrade the schema
//! outbox status                                   pending, dead, lag; the same per event type
//! outbox dead list [--aggregate-type T] [--event-type T] [--limit N] [--after EVENT_ID]
//! outbox dead show EVENT_ID                       payload, headers, the full last error
//! outbox dead requeue (EVENT_ID | --all | --aggregate-type T | --event-type T)
//! outbox dead discard (EVENT_ID | --all | --aggregate-type T | --event-type T)
//! outbox purge --older-than 7d                    delete published events older than that
//! outbox forward --to nats://HOST:PORT --stream S forward events to a broker until SIGTERM
//! outbox console [--bind ADDR] [--read-only]      the operations console in the browser
//! ```
//!
//! The database is `--database-url postgres://user@host:port/db`, or `DATABASE_URL`; on
//! `sqlite://file.db` and `mysql://user@host:port/db`, `migrate` so far.
//! `requeue` and `discard` refuse to run without a selector: acting on every dead event takes
//! an explicit `--all`. Naming one event that is not dead is an error; a filter that matches
//! nothing is not.
//!
//! Output is aligned text by default. `--json` prints one JSON document on stdout instead, with
//! stable field names listed in each command's `--help` (timestamps RFC 3339 in UTC, durations
//! in seconds). Errors go to stderr as one line of text, with exit status 1 (2 for usage
//! errors): a malformed URL, an unreachable database (named by host and port, never by its URL,
//! which may hold a password; the wait is at most 5 s), and a missing or outdated schema ("run
//! `outbox migrate`") each get their own message. Every command but `migrate` checks the schema
//! first; a schema migrated by a newer version is used as it is.

mod cli;
mod commands;
mod connect;
mod console;
mod error;
mod forward;
mod output;
mod percent;

use std::io::{self, Write};
use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};
use crate::error::Failure;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // The TLS clients (sqlx's, lapin's, redis's, async-nats's) all run on rustls with ring; the
    // ones that ask rustls for the process's provider find it here.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match run(&cli).await {
        Ok(text) => {
            // A closed stdout (`outbox dead list | head`) is not worth a panic.
            let _ = io::stdout().lock().write_all(text.as_bytes());
            ExitCode::SUCCESS
        }
        Err(failure) => {
            eprintln!("error: {failure}");
            ExitCode::FAILURE
        }
    }
}

/// Connects, runs the command, and renders its report.
async fn run(cli: &Cli) -> Result<String, Failure> {
    if let Command::Console(args) = &cli.command {
        console::check(args)?;
    }
    let database = connect::connect(cli.database_url.as_deref()).await?;
    let report = commands::run(&database, &cli.command).await;
    database.close().await;
    let report = report?;
    Ok(if cli.json { format!("{:#}\n", output::json(&report)) } else { output::human(&report) })
}
