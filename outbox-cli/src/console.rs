//! `outbox console`: the runtime's console served until SIGINT or SIGTERM.

use std::net::SocketAddr;

use outbox_runtime::console::Console;
use sqlx::PgPool;
use tokio::net::TcpListener;

use crate::cli::ConsoleArgs;
use crate::error::Failure;

/// Shorter tokens are accepted with a warning: they can be guessed.
const SHORT_TOKEN: usize = 16;

/// The token, from the environment only: a command line is visible to every user of the machine.
fn token() -> Option<String> {
    std::env::var("OUTBOX_CONSOLE_TOKEN").ok().filter(|token| !token.is_empty())
}

/// Refuses an address beyond loopback without a token, before anything connects.
pub fn check(args: &ConsoleArgs) -> Result<(), Failure> {
    match token() {
        None if !args.bind.ip().is_loopback() => Err(Failure::ConsoleNeedsToken(args.bind)),
        _ => Ok(()),
    }
}

/// Serves until SIGINT or SIGTERM; `main` has run [`check`].
pub async fn run(pool: &PgPool, args: &ConsoleArgs) -> Result<(), Failure> {
    let token = token();
    match &token {
        Some(token) if token.len() < SHORT_TOKEN => eprintln!(
            "warning: OUTBOX_CONSOLE_TOKEN has {} characters; use a long random one (`openssl \
             rand -hex 32`)",
            token.len()
        ),
        _ => {}
    }
    let listener = TcpListener::bind(args.bind)
        .await
        .map_err(|reason| Failure::ConsoleBind { address: args.bind, reason })?;
    let address = listener.local_addr().unwrap_or(args.bind);
    let mut console = Console::new(pool.clone()).read_only(args.read_only);
    let access = match token {
        Some(token) => {
            console = console.token(token);
            "log in with OUTBOX_CONSOLE_TOKEN"
        }
        None => "loopback only, no token",
    };
    let mode = if args.read_only { ", read-only" } else { "" };
    eprintln!("outbox console on http://{address}/ ({access}{mode}); stop with Ctrl-C");
    let app = console.router().into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(crate::forward::stop_signal())
        .await
        .map_err(Failure::ConsoleServe)
}
