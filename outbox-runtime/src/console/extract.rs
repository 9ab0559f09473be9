//! What the pages' handlers take from a request that passed the [guard](super::guard): the
//! page's context, and a form that proved it came from the console's own page.

use axum::extract::{Form, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::auth::Session;
use super::guard::Base;
use super::problem::Problem;

/// What every page needs to draw its links and forms.
#[derive(Clone)]
pub(super) struct Page {
    /// The path the console is mounted at.
    pub(super) base: String,
    /// The session's CSRF token, for the page's forms.
    pub(super) csrf: String,
    /// Offer no action.
    pub(super) read_only: bool,
    /// Logged in with the token (so a logout is offered).
    pub(super) logged_in: bool,
}

impl Page {
    /// The URL of the console's `path` (`""` is the overview) wherever it is mounted.
    pub(super) fn link(&self, path: &str) -> String {
        match (self.base.is_empty(), path.is_empty()) {
            (true, true) => "/".to_owned(),
            _ => format!("{}{path}", self.base),
        }
    }
}

impl FromRequestParts<super::State> for Page {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut Parts,
        console: &super::State,
    ) -> Result<Self, Problem> {
        let base =
            parts.extensions.get::<Base>().map(|Base(base)| base.clone()).unwrap_or_default();
        let session = parts.extensions.get::<Session>();
        Ok(Page {
            base,
            csrf: session.map(|session| console.keys.csrf_token(session)).unwrap_or_default(),
            read_only: console.read_only,
            logged_in: console.keys.has_token() && session.is_some(),
        })
    }
}

/// A posted form whose `csrf` field is the session's CSRF token: the only way the pages'
/// handlers take a form, so none can forget the check.
pub(super) struct Action<T>(pub(super) T);

#[derive(Deserialize)]
struct Posted<T> {
    #[serde(default)]
    csrf: String,
    #[serde(flatten)]
    form: T,
}

impl<T: DeserializeOwned + Send> FromRequest<super::State> for Action<T> {
    type Rejection = Response;

    async fn from_request(request: Request, console: &super::State) -> Result<Self, Response> {
        let session = request.extensions().get::<Session>().cloned();
        let Form(posted) = Form::<Posted<T>>::from_request(request, console)
            .await
            .map_err(IntoResponse::into_response)?;
        match session {
            Some(session) if console.keys.is_csrf_token(&session, &posted.csrf) => {
                Ok(Action(posted.form))
            }
            _ => Err(Problem::StaleForm.into_response()),
        }
    }
}
