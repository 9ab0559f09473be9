//! Who may use the console: the token, the session cookie a login sets, the CSRF token every
//! form carries, and the loopback rule for a console without a token.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::ConnectInfo;
use axum::http::{header, HeaderMap, Request};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use uuid::Uuid;

type HmacSha256 = Hmac<Sha256>;

/// The session cookie's name.
pub(super) const SESSION_COOKIE: &str = "outbox_console";

/// How long a login lasts.
pub(super) const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 60 * 60);

/// The secrets of one console: the token people and scripts present, and the key that signs
/// sessions and CSRF tokens.
pub(super) struct Keys {
    token: Option<String>,
    key: [u8; 32],
}

/// A browser's session: the signed cookie value, to which its CSRF token is bound.
#[derive(Clone)]
pub(super) struct Session {
    pub(super) cookie: String,
}

impl Keys {
    /// With a token the key derives from it, so consoles serving one token (replicas, a
    /// restart) accept each other's sessions, and changing the token ends them all. Without
    /// one, the key is this process's own.
    pub(super) fn new(token: Option<String>) -> Self {
        let key = match &token {
            Some(token) => Sha256::new()
                .chain_update(b"outbox-console session key\0")
                .chain_update(token.as_bytes())
                .finalize()
                .into(),
            None => {
                let mut key = [0; 32];
                key[..16].copy_from_slice(Uuid::new_v4().as_bytes());
                key[16..].copy_from_slice(Uuid::new_v4().as_bytes());
                key
            }
        };
        Keys { token, key }
    }

    /// Whether the console asks for a token.
    pub(super) fn has_token(&self) -> bool {
        self.token.is_some()
    }

    /// Whether `candidate` is the token, compared in constant time.
    pub(super) fn is_token(&self, candidate: &str) -> bool {
        let Some(token) = &self.token else { return false };
        let expected = self.mac(&[b"token", token.as_bytes()]).finalize().into_bytes();
        self.mac(&[b"token", candidate.as_bytes()]).verify_slice(&expected).is_ok()
    }

    /// Whether the request carries `Authorization: Bearer <token>`.
    pub(super) fn has_bearer(&self, headers: &HeaderMap) -> bool {
        headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .is_some_and(|candidate| self.is_token(candidate.trim()))
    }

    /// A new session, valid for [`SESSION_LIFETIME`].
    pub(super) fn new_session(&self) -> Session {
        let expires = unix_now() + SESSION_LIFETIME.as_secs();
        let claims = format!("{expires}.{}", Uuid::new_v4().simple());
        let signature = hex(&self.mac(&[b"session", claims.as_bytes()]).finalize().into_bytes());
        Session { cookie: format!("{claims}.{signature}") }
    }

    /// The request's session, if its cookie is one of ours and has not expired.
    pub(super) fn session(&self, headers: &HeaderMap) -> Option<Session> {
        let cookie = cookie(headers, SESSION_COOKIE)?;
        let (claims, signature) = cookie.rsplit_once('.')?;
        let signature = unhex(signature)?;
        self.mac(&[b"session", claims.as_bytes()]).verify_slice(&signature).ok()?;
        let expires: u64 = claims.split_once('.')?.0.parse().ok()?;
        (expires > unix_now()).then(|| Session { cookie: cookie.to_owned() })
    }

    /// The CSRF token of a session: what its forms carry in the `csrf` field.
    pub(super) fn csrf_token(&self, session: &Session) -> String {
        hex(&self.mac(&[b"csrf", session.cookie.as_bytes()]).finalize().into_bytes())
    }

    /// Whether `candidate` is the session's CSRF token, compared in constant time.
    pub(super) fn is_csrf_token(&self, session: &Session, candidate: &str) -> bool {
        unhex(candidate).is_some_and(|candidate| {
            self.mac(&[b"csrf", session.cookie.as_bytes()]).verify_slice(&candidate).is_ok()
        })
    }

    /// The key's MAC over the parts, each ended by a NUL so no two splits sign alike.
    fn mac(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        for part in parts {
            mac.update(part);
            mac.update(b"\0");
        }
        mac
    }
}

/// The `Set-Cookie` of a session (`None`: the one that ends it): invisible to scripts, never
/// sent with a request another site starts, scoped to the console's path, and `Secure` when
/// the request came through a TLS proxy.
pub(super) fn session_cookie(session: Option<&Session>, path: &str, headers: &HeaderMap) -> String {
    let path = if path.is_empty() { "/" } else { path };
    let (value, max_age) = match session {
        Some(session) => (session.cookie.as_str(), SESSION_LIFETIME.as_secs()),
        None => ("", 0),
    };
    let tls = headers
        .get("x-forwarded-proto")
        .is_some_and(|proto| proto.as_bytes().eq_ignore_ascii_case(b"https"));
    let secure = if tls { "; Secure" } else { "" };
    format!("{SESSION_COOKIE}={value}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}")
}

/// Whether the request came over loopback, names a loopback host, and was not forwarded. The
/// peer address alone is not enough: a web page can make a browser send requests to 127.0.0.1
/// under a host name of the attacker's that resolves there (DNS rebinding), which its `Host`
/// header gives away; and a reverse proxy on the same machine connects over loopback on behalf
/// of anyone, which its forwarding headers give away.
pub(super) fn is_loopback<B>(request: &Request<B>) -> bool {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>();
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|host| host.to_str().ok());
    let forwarded = ["forwarded", "x-forwarded-for", "x-real-ip"]
        .into_iter()
        .any(|name| headers.contains_key(name));
    peer.is_some_and(|ConnectInfo(peer)| peer.ip().to_canonical().is_loopback())
        && host.is_some_and(is_loopback_host)
        && !forwarded
}

/// `localhost`, `127.0.0.1` or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once(']').map_or(bracketed, |(name, _)| name),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|address| address.is_loopback())
}

/// Whether a state-changing request came from the console's own pages: its `Origin`, which
/// browsers send with every POST, names the host it was sent to. (The CSRF token is the check
/// that does not rely on the browser; this one costs nothing.)
pub(super) fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else { return true };
    let host = headers.get(header::HOST).and_then(|host| host.to_str().ok());
    let origin = origin.to_str().ok();
    match (origin, host) {
        (Some(origin), Some(host)) => {
            let origin = origin.split_once("://").map_or(origin, |(_, rest)| rest);
            origin.eq_ignore_ascii_case(host)
        }
        _ => false,
    }
}

fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find_map(|(key, value)| (key == name).then_some(value))
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn with_cookie(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let cookie = format!("other=1; {SESSION_COOKIE}={value}");
        headers.insert(header::COOKIE, HeaderValue::from_str(&cookie).unwrap());
        headers
    }

    #[test]
    fn a_session_is_accepted_by_its_key_only() {
        let keys = Keys::new(Some("secret".into()));
        let session = keys.new_session();
        assert!(keys.session(&with_cookie(&session.cookie)).is_some());
        // Another console's token, a tampered expiry, garbage: refused.
        assert!(Keys::new(Some("other".into())).session(&with_cookie(&session.cookie)).is_none());
        let tampered = format!("9{}", session.cookie);
        assert!(keys.session(&with_cookie(&tampered)).is_none());
        assert!(keys.session(&with_cookie("1.2.zz")).is_none());
        // The same token in another process signs alike (replicas, restarts).
        assert!(Keys::new(Some("secret".into())).session(&with_cookie(&session.cookie)).is_some());
    }

    #[test]
    fn a_csrf_token_belongs_to_its_session() {
        let keys = Keys::new(None);
        let (one, two) = (keys.new_session(), keys.new_session());
        let token = keys.csrf_token(&one);
        assert!(keys.is_csrf_token(&one, &token));
        assert!(!keys.is_csrf_token(&two, &token));
        assert!(!keys.is_csrf_token(&one, ""));
        assert!(!keys.is_csrf_token(&one, "not hex"));
    }

    #[test]
    fn tokens_are_compared_exactly() {
        let keys = Keys::new(Some("secret".into()));
        assert!(keys.is_token("secret"));
        assert!(!keys.is_token("secre"));
        assert!(!keys.is_token("secret "));
        assert!(!Keys::new(None).is_token(""));
    }

    #[test]
    fn loopback_hosts_are_recognised_with_and_without_ports() {
        for host in ["localhost", "LOCALHOST:8080", "127.0.0.1", "127.0.0.1:80", "[::1]:8080"] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in ["example.com", "localhost.example.com:80", "10.0.0.1", "[::2]", ""] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn an_origin_must_name_the_host() {
        let headers = |origin: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
            headers.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
            headers
        };
        assert!(same_origin(&headers("http://127.0.0.1:8080")));
        assert!(!same_origin(&headers("http://evil.example")));
        assert!(!same_origin(&headers("null")));
    }
}
