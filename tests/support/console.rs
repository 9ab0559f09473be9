//! The console served on a port of the test's own, as `outbox console` serves it.

use std::net::SocketAddr;

use axum::Router;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A console served on 127.0.0.1 at a free port until dropped.
pub struct Served {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    pub address: SocketAddr,
    server: JoinHandle<()>,
}

impl Served {
    /// Serves `router` with the peer addresses the console's loopback rule reads.
    pub async fn start(router: Router) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = router.into_make_service_with_connect_info::<SocketAddr>();
        let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Served { url: format!("http://{address}"), address, server }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// A client that follows no redirect, so tests see them.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// The value of the hidden input `name` in an HTML page.
pub fn hidden(page: &str, name: &str) -> Option<String> {
    let marker = format!("name=\"{name}\" value=\"");
    let start = page.find(&marker)? + marker.len();
    let end = start + page[start..].find('"')?;
    Some(page[start..end].replace("&amp;", "&").replace("&quot;", "\""))
}

/// Every hidden input of the first form posting to `action`, as (name, value) pairs.
pub fn form_fields(page: &str, action: &str) -> Vec<(String, String)> {
    let start = page.find(&format!("action=\"{action}\"")).expect("the page has the form");
    let form = &page[start..start + page[start..].find("</form>").unwrap()];
    form.split("<input type=\"hidden\" ")
        .skip(1)
        .filter_map(|input| {
            let name = input.strip_prefix("name=\"")?.split('"').next()?;
            Some((name.to_owned(), hidden(input, name)?))
        })
        .collect()
}

/// The `outbox_console` cookie a response sets, as `name=value` for a `Cookie` header.
pub fn session_cookie(response: &reqwest::Response) -> Option<String> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .find(|cookie| cookie.starts_with("outbox_console="))
        .map(|cookie| cookie.split(';').next().unwrap().to_owned())
}
