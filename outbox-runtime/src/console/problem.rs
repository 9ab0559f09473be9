//! What goes wrong in a console request, and how each is answered: an HTML page for people, a
//! JSON `{"error": ...}` for the API; each says what to do.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use maud::{html, DOCTYPE};

use crate::error::ErrorChain;

#[derive(Debug)]
pub(super) enum Problem {
    /// The outbox could not be read or changed.
    Outbox(crate::Error),
    /// A filter or form field that does not parse, with what is expected.
    BadInput(String),
    /// Nothing there, with what to try.
    NotFound(String),
    /// A POST without the session's CSRF token.
    StaleForm,
    /// A POST whose `Origin` is not the host it was sent to.
    ForeignOrigin,
    /// A request from beyond loopback to a console without a token.
    LoopbackOnly,
}

impl From<crate::Error> for Problem {
    fn from(error: crate::Error) -> Self {
        Problem::Outbox(error)
    }
}

impl Problem {
    fn status(&self) -> StatusCode {
        match self {
            Problem::Outbox(_) => StatusCode::SERVICE_UNAVAILABLE,
            Problem::BadInput(_) => StatusCode::BAD_REQUEST,
            Problem::NotFound(_) => StatusCode::NOT_FOUND,
            Problem::StaleForm | Problem::ForeignOrigin | Problem::LoopbackOnly => {
                StatusCode::FORBIDDEN
            }
        }
    }

    fn message(&self) -> String {
        match self {
            Problem::Outbox(error) => format!(
                "{}; `outbox status` against the console's database says whether it is \
                 reachable and migrated, and a permission error names the grant the console's \
                 role lacks (docs/least-privilege.sql); then reload",
                ErrorChain(error)
            ),
            Problem::BadInput(message) | Problem::NotFound(message) => message.clone(),
            Problem::StaleForm => "the form is stale (its session ended or changed): reload the \
                                  console's page and submit it again"
                .to_owned(),
            Problem::ForeignOrigin => "the request's Origin is not the host it was sent to: \
                                      submit the console's own pages at the address you opened; \
                                      behind a reverse proxy, have it pass the Host header on"
                .to_owned(),
            Problem::LoopbackOnly => "this console has no token, so it answers loopback \
                                     requests only: open it on the machine it runs on, or start \
                                     it with a token (OUTBOX_CONSOLE_TOKEN, Console::token)"
                .to_owned(),
        }
    }

    fn log(&self) {
        if let Problem::Outbox(error) = self {
            tracing::warn!(error = %ErrorChain(error), "outbox console: a request failed");
        }
    }

    /// The API's answer: the status and `{"error": message}`.
    pub(super) fn json(self) -> Response {
        self.log();
        (self.status(), Json(serde_json::json!({ "error": self.message() }))).into_response()
    }
}

/// The pages' answer: a page of its own (no navigation, since the request may not be allowed
/// any).
impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        self.log();
        let page = html! {
            (DOCTYPE)
            html lang="en" {
                head { meta charset="utf-8"; title { "outbox console: error" } }
                body { h1 { "Something went wrong" } p.problem { (self.message()) } }
            }
        };
        (self.status(), page).into_response()
    }
}

/// [`Problem`] answered as JSON, for the API's handlers.
pub(super) struct ApiProblem(pub(super) Problem);

impl<E: Into<Problem>> From<E> for ApiProblem {
    fn from(error: E) -> Self {
        ApiProblem(error.into())
    }
}

impl IntoResponse for ApiProblem {
    fn into_response(self) -> Response {
        self.0.json()
    }
}
