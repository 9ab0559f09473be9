//! The middleware every request passes: who may see what (see the module docs), the path the
//! console is mounted at, and the security headers of every response.

use axum::extract::{OriginalUri, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::auth::{self, Session};
use super::problem::Problem;

/// The path the console is mounted at (`""` at the root, `"/outbox"` when nested there): links
/// and the session cookie are made under it.
#[derive(Clone)]
pub(super) struct Base(pub(super) String);

pub(super) async fn guard(
    State(console): State<super::State>,
    mut request: Request,
    next: Next,
) -> Response {
    let base = base_path(&request);
    let mut response = match admit(&console, &request) {
        Ok(admitted) => {
            let new_session = match admitted {
                Admitted::Session(session) => {
                    request.extensions_mut().insert(session);
                    None
                }
                Admitted::NewSession(session) => {
                    let cookie = auth::session_cookie(Some(&session), &base, request.headers());
                    request.extensions_mut().insert(session);
                    Some(cookie)
                }
                Admitted::Plain => None,
            };
            request.extensions_mut().insert(Base(base));
            let mut response = next.run(request).await;
            if let Some(cookie) = new_session.and_then(|c| HeaderValue::from_str(&c).ok()) {
                response.headers_mut().append(header::SET_COOKIE, cookie);
            }
            response
        }
        Err(refusal) => refusal.into_response(base),
    };
    secure(&mut response);
    response
}

enum Admitted {
    /// Through with the session its cookie names.
    Session(Session),
    /// A browser without a session on a console without a token: one is made for its forms.
    NewSession(Session),
    /// An API call, the stylesheet, or the login page: no session involved.
    Plain,
}

/// Why a request is turned away: it learns nothing else.
enum Refusal {
    Problem(Problem),
    /// An API call without the token.
    NoBearer,
    /// A page without a session: to the login page.
    LogIn,
    /// Anything else without a session.
    NoSession,
}

impl Refusal {
    fn into_response(self, base: String) -> Response {
        match self {
            Refusal::Problem(problem) => problem.into_response(),
            Refusal::NoBearer => {
                (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")]).into_response()
            }
            Refusal::LogIn => Redirect::to(&format!("{base}/login")).into_response(),
            Refusal::NoSession => StatusCode::UNAUTHORIZED.into_response(),
        }
    }
}

fn admit(console: &super::State, request: &Request) -> Result<Admitted, Refusal> {
    let path = request.uri().path();
    let keys = &console.keys;
    if !keys.has_token() && !auth::is_loopback(request) {
        return Err(Refusal::Problem(Problem::LoopbackOnly));
    }
    if path.starts_with("/assets/") {
        return Ok(Admitted::Plain);
    }
    if request.method() == Method::POST && !auth::same_origin(request.headers()) {
        return Err(Refusal::Problem(Problem::ForeignOrigin));
    }
    let is_api = path == "/api" || path.starts_with("/api/");
    if is_api {
        if keys.has_token() && !keys.has_bearer(request.headers()) {
            return Err(Refusal::NoBearer);
        }
        return Ok(Admitted::Plain);
    }
    match keys.session(request.headers()) {
        Some(session) => Ok(Admitted::Session(session)),
        None if !keys.has_token() => Ok(Admitted::NewSession(keys.new_session())),
        None if path == "/login" => Ok(Admitted::Plain),
        None if request.method() == Method::GET => Err(Refusal::LogIn),
        None => Err(Refusal::NoSession),
    }
}

/// The prefix the request's path had before a [`nest`](axum::Router::nest) stripped it.
fn base_path(request: &Request) -> String {
    let inner = request.uri().path();
    let Some(OriginalUri(original)) = request.extensions().get::<OriginalUri>() else {
        return String::new();
    };
    let original = original.path();
    let base = original.strip_suffix(inner).unwrap_or_else(|| original.trim_end_matches('/'));
    base.trim_end_matches('/').to_owned()
}

/// Headers for every response: nothing runs or loads but the console's own stylesheet, no
/// other site frames it or receives its forms or a referrer, and nothing is cached.
fn secure(response: &mut Response) {
    let headers = response.headers_mut();
    let policy = "default-src 'none'; style-src 'self'; img-src 'self' data:; \
                  form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(policy));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: under it browsers send `Origin: null` with the console's own forms.
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}
