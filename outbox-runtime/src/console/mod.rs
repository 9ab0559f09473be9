//! An operations console: what an on-call engineer opens when an alert says the outbox lags.
//! Pages (overview, relays, an event by id, dead letters, pauses and replays) and the same as a
//! JSON API, as an axum [`Router`] to mount in a service or to serve with `outbox console`.
//!
//! ```no_run
//! # use outbox_runtime::sqlx;
//! # async fn serve(pool: sqlx::PgPool) -> std::io::Result<()> {
//! use std::net::SocketAddr;
//! use outbox_runtime::console::Console;
//!
//! let console = Console::new(pool).token(std::env::var("OUTBOX_CONSOLE_TOKEN").unwrap());
//! let app = axum::Router::new().nest("/outbox", console.router());
//! let listener = tokio::net::TcpListener::bind("0.0.0.0:8080").await?;
//! // The peer address tells a loopback request apart: serve with it.
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
//! # }
//! ```
//!
//! # Who may use it
//! - **With a [token](Console::token)**, people log in with it on the login page, which sets a
//!   session cookie (`HttpOnly`, `SameSite=Strict`, 12 hours), and scripts send it as
//!   `Authorization: Bearer <token>` to `/api/...`. A request without it gets nothing: the pages
//!   redirect to the login page, the API answers 401 with an empty body.
//! - **Without one**, the console answers only requests that came over loopback (the peer
//!   address, which the server must [provide](axum::Router::into_make_service_with_connect_info))
//!   to a loopback host name (which defeats DNS rebinding); any other request is refused.
//! - Every state-changing request is a POST: forms carry a CSRF token bound to the session, and
//!   a POST whose `Origin` names another site is refused. A [read-only](Console::read_only)
//!   console serves no action at all.
//! - Every response carries a Content-Security-Policy that allows nothing but the console's own
//!   stylesheet (no script, no frame, no form sent elsewhere), and is never cached. Nothing is
//!   logged but failures, with their cause: no payload, no token.
//!
//! # The JSON API
//! The shapes are those of `outbox ... --json`.
//! - `GET /api/overview`: `outbox status`, `delivered_last_hour`, and `activity`: the minutes of
//!   the last day in which a relay ran (`minute`, `delivered`, `pending`, `dead`,
//!   `oldest_pending_age_secs`), as the relays recorded them in `outbox.activity`.
//! - `GET /api/relays`, `GET /api/events/{id}`.
//! - `GET /api/aggregate?aggregate_type=&aggregate_id=`: `{"events": [..200], "complete": bool}`
//!   (see [`events::of_aggregate`](crate::events::of_aggregate)).
//! - `GET /api/dead?aggregate_type=&event_type=&error=&newer_than=&older_than=&after=`:
//!   `{"count": int, "events": [..50], "next_after": id|null}`.
//! - `POST /api/dead/requeue`, `POST /api/dead/discard` with the same filter as a JSON object
//!   (`{}` is every dead letter): `{"requeued": int}`, `{"discarded": int}`.
//! - `POST /api/pause` (`{"aggregate_type", "event_type", "reason"}`), `POST /api/resume`.
//! - `POST /api/replay` (`{"aggregate_type", "event_type", "newer_than", "older_than"}`).

mod actions;
mod api;
mod auth;
mod chart;
mod extract;
mod filters;
mod guard;
mod overview;
mod pages;
mod problem;
mod views;

use std::sync::Arc;

use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use axum::Router;
use sqlx::PgPool;

/// The console, configured; [`router`](Console::router) makes it a [`Router`].
pub struct Console {
    pool: PgPool,
    token: Option<String>,
    read_only: bool,
}

impl std::fmt::Debug for Console {
    /// Never the token: a `Console` may end up in a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

/// What every request handler shares.
struct Shared {
    pool: PgPool,
    keys: auth::Keys,
    read_only: bool,
}

type State = Arc<Shared>;

impl Console {
    /// A console of the outbox in `pool`'s database, without a token (loopback only) and with
    /// its actions.
    pub fn new(pool: PgPool) -> Self {
        Console { pool, token: None, read_only: false }
    }

    /// Asks for this token: at the login page, or as `Authorization: Bearer` on the API. Use a
    /// long random one (`openssl rand -hex 32`); an empty token counts as none.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into()).filter(|token| !token.is_empty());
        self
    }

    /// Serves the pages and the API's reads only: no requeue, discard, pause, resume or replay
    /// (their routes do not exist, and no page offers them).
    pub fn read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// The console's routes, to serve or to [`nest`](Router::nest) under a path of yours (links
    /// and the cookie follow the path it is mounted at).
    pub fn router(self) -> Router {
        let read_only = self.read_only;
        let shared =
            Arc::new(Shared { pool: self.pool, keys: auth::Keys::new(self.token), read_only });
        let mut router = Router::new()
            .route("/", get(pages::overview))
            .route("/relays", get(pages::relays))
            .route("/events", get(pages::find_event))
            .route("/events/{id}", get(pages::event))
            .route("/aggregate", get(pages::aggregate))
            .route("/dead", get(actions::dead))
            .route("/control", get(actions::control))
            .route("/login", get(pages::login_form).post(pages::login))
            .route("/logout", post(pages::logout))
            .route("/assets/console.css", get(pages::stylesheet))
            .route("/api/overview", get(api::overview))
            .route("/api/relays", get(api::relays))
            .route("/api/events/{id}", get(api::event))
            .route("/api/aggregate", get(api::aggregate))
            .route("/api/dead", get(api::dead));
        if !read_only {
            router = router
                .route("/dead/confirm", get(actions::confirm_dead))
                .route("/dead/{action}", post(actions::act_on_dead))
                .route("/control/replay/confirm", get(actions::confirm_replay))
                .route("/control/pause", post(actions::pause))
                .route("/control/resume", post(actions::resume))
                .route("/control/replay", post(actions::replay))
                .route("/api/dead/{action}", post(api::act_on_dead))
                .route("/api/pause", post(api::pause))
                .route("/api/resume", post(api::resume))
                .route("/api/replay", post(api::replay));
        }
        router
            .fallback(pages::not_found)
            .layer(from_fn_with_state(shared.clone(), guard::guard))
            .with_state(shared)
    }
}
