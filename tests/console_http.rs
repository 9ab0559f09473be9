//! The console's rules over HTTP, against the real database: who gets what with and without the
//! token, CSRF and origin checks on every action, the loopback rule, read-only consoles, the
//! confirmation that counts what the action touches, and the API.

mod support;

use outbox_runtime::console::Console;
use outbox_runtime::{dead_letters, pauses};
use reqwest::header::{
    CONTENT_SECURITY_POLICY, COOKIE, LOCATION, ORIGIN, SET_COOKIE, WWW_AUTHENTICATE,
};
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::PgPool;
use support::console::{client, form_fields, hidden, session_cookie, Served};
use support::*;
use uuid::Uuid;

const TOKEN: &str = "a-console-token-for-the-tests-0123456789";

/// Every answer, refusals included, carries the policy that allows no script.
fn assert_secure(response: &reqwest::Response) {
    let policy = response.headers().get(CONTENT_SECURITY_POLICY).expect("a CSP on every answer");
    let policy = policy.to_str().unwrap();
    assert!(
        policy.contains("default-src 'none'") && policy.contains("frame-ancestors 'none'"),
        "{policy}"
    );
    assert_eq!(response.headers()["cache-control"], "no-store");
}

/// The JSON a request is answered with.
async fn answer(request: reqwest::RequestBuilder) -> Value {
    request.send().await.unwrap().json().await.unwrap()
}

async fn logged_in(served: &Served) -> String {
    let response = client()
        .post(format!("{}/login", served.url))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    session_cookie(&response).expect("a login sets the session cookie")
}

#[sqlx::test(migrations = false)]
async fn without_the_token_a_request_gets_nothing(pool: PgPool) {
    migrated(&pool).await;
    let dead = dead_row(&pool, "order", "order.placed", "refused: 4200 cents").await;
    emit_committed(&pool, &[placed(1), placed(2)]).await;
    let served = Served::start(Console::new(pool.clone()).token(TOKEN).router()).await;
    let http = client();

    // The API: 401, a challenge, and an empty body, with no token, a wrong one, or a cookie.
    for authorization in [None, Some("Bearer wrong-token"), Some("Basic YTpi")] {
        let mut request = http.get(format!("{}/api/overview", served.url));
        if let Some(authorization) = authorization {
            request = request.header("authorization", authorization);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{authorization:?}");
        assert_eq!(response.headers()[WWW_AUTHENTICATE], "Bearer");
        assert_secure(&response);
        assert_eq!(response.text().await.unwrap(), "", "nothing for {authorization:?}");
    }

    // Pages: a redirect to the login page and nothing else; an action: 401, and nothing done.
    for page in ["/", "/dead", "/relays", "/control", &format!("/events/{dead}")] {
        let response = http.get(format!("{}{page}", served.url)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::SEE_OTHER, "{page}");
        assert_eq!(response.headers()[LOCATION], "/login", "{page}");
        assert_secure(&response);
        assert_eq!(response.text().await.unwrap(), "", "{page}");
    }
    let response = http
        .post(format!("{}/dead/requeue", served.url))
        .form(&[("event_id", dead.to_string())])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.text().await.unwrap(), "");
    assert!(row_state(&pool, dead).await.dead, "the dead letter was not requeued");

    // The login page shows no figure; a wrong token sets no cookie.
    let login =
        http.get(format!("{}/login", served.url)).send().await.unwrap().text().await.unwrap();
    assert!(login.contains("name=\"token\"") && !login.contains("id=\"pending\""), "{login}");
    let refused = http
        .post(format!("{}/login", served.url))
        .form(&[("token", "guess")])
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert!(session_cookie(&refused).is_none());
}

#[sqlx::test(migrations = false)]
async fn the_token_logs_people_in_and_lets_scripts_call_the_api(pool: PgPool) {
    migrated(&pool).await;
    dead_row(&pool, "order", "order.placed", "refused").await;
    emit_committed(&pool, &[placed(1), placed(2), placed(3)]).await;
    // What relays recorded: 40 delivered five minutes ago, 2 two hours ago (outside the hour).
    sqlx::query(
        "INSERT INTO outbox.activity (minute, delivered, pending, dead, oldest_pending_age_secs, \
                                      read) \
         VALUES (date_trunc('minute', now()) - interval '5 minutes', 40, 3, 1, 12.5, true), \
                (date_trunc('minute', now()) - interval '2 hours', 2, 0, 1, NULL, true)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let served = Served::start(Console::new(pool.clone()).token(TOKEN).router()).await;
    let http = client();

    let response =
        http.post(format!("{}/login", served.url)).form(&[("token", TOKEN)]).send().await.unwrap();
    let set_cookie = response.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(set_cookie.contains(attribute), "{set_cookie} lacks {attribute}");
    }
    assert!(!set_cookie.contains("Secure"), "plain HTTP: {set_cookie}");
    let cookie = session_cookie(&response).unwrap();
    // Behind a TLS proxy the cookie is sent over TLS only.
    let behind_tls = http
        .post(format!("{}/login", served.url))
        .header("x-forwarded-proto", "https")
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert!(behind_tls.headers()[SET_COOKIE].to_str().unwrap().ends_with("; Secure"));
    let overview = http.get(&served.url).header(COOKIE, &cookie).send().await.unwrap();
    assert_eq!(overview.status(), StatusCode::OK);
    let overview = overview.text().await.unwrap();
    assert!(overview.contains("id=\"pending\">3<"), "{overview}");
    assert!(overview.contains("action=\"/logout\""), "a logged-in page offers a logout");
    assert!(overview.contains("id=\"delivered\">40<"), "{overview}");
    assert!(overview.contains(": 40</title>") && overview.contains(": 12s</title>"), "charted");

    // The session cookie does not open the API: scripts send the token.
    let cookie_only = http.get(format!("{}/api/overview", served.url)).header(COOKIE, &cookie);
    assert_eq!(cookie_only.send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let api =
        http.get(format!("{}/api/overview", served.url)).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(api.status(), StatusCode::OK);
    let api: Value = api.json().await.unwrap();
    let stats = outbox_runtime::stats(&pool).await.unwrap();
    assert_eq!(api["pending"], stats.pending);
    assert_eq!(api["dead"], stats.dead);
    assert_eq!(api["by_type"].as_array().unwrap().len(), 1, "{api}");
    assert_eq!(api["delivered_last_hour"], 40);
    assert_eq!(api["activity"].as_array().unwrap().len(), 2, "{api}");
    assert_eq!(api["activity"][1]["oldest_pending_age_secs"], 12.5);

    // Logging out ends the session in the browser.
    let page =
        http.get(format!("{}/relays", served.url)).header(COOKIE, &cookie).send().await.unwrap();
    let csrf = hidden(&page.text().await.unwrap(), "csrf").unwrap();
    let out = http
        .post(format!("{}/logout", served.url))
        .header(COOKIE, &cookie)
        .form(&[("csrf", csrf)])
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    assert!(out.headers()[SET_COOKIE].to_str().unwrap().contains("Max-Age=0"));
}

#[sqlx::test(migrations = false)]
async fn every_action_needs_the_sessions_csrf_token_and_the_consoles_origin(pool: PgPool) {
    migrated(&pool).await;
    let dead = dead_row(&pool, "order", "order.placed", "refused").await;
    let served = Served::start(Console::new(pool.clone()).router()).await;
    let http = client();
    let confirm = format!("{}/dead/confirm?action=requeue&event_id={dead}", served.url);
    let first = http.get(&confirm).send().await.unwrap();
    let cookie =
        session_cookie(&first).expect("a console without a token gives each browser a session");
    let page = first.text().await.unwrap();
    assert!(page.contains("requeue 1 dead letter"), "{page}");
    let fields = form_fields(&page, "/dead/requeue");
    let other_session = session_cookie(&http.get(&served.url).send().await.unwrap()).unwrap();
    let post = |cookie: &str, fields: &[(String, String)]| {
        http.post(format!("{}/dead/requeue", served.url)).header(COOKIE, cookie).form(fields)
    };

    let without: Vec<_> = fields.iter().filter(|(name, _)| name != "csrf").cloned().collect();
    let forged: Vec<_> = fields
        .iter()
        .map(|(name, value)| {
            (name.clone(), if name == "csrf" { "00".repeat(32) } else { value.clone() })
        })
        .collect();
    for (what, request) in [
        ("no token", post(&cookie, &without)),
        ("a forged token", post(&cookie, &forged)),
        ("another session's cookie", post(&other_session, &fields)),
        ("another site's origin", post(&cookie, &fields).header(ORIGIN, "http://evil.example")),
    ] {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{what}");
        assert_secure(&response);
        assert!(row_state(&pool, dead).await.dead, "{what}: nothing was requeued");
    }

    let origin = format!("http://{}", served.address);
    let response = post(&cookie, &fields).header(ORIGIN, origin).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.text().await.unwrap().contains("Requeued 1 dead letters"));
    let state = row_state(&pool, dead).await;
    assert!(!state.dead && state.attempts == 0, "requeued: {state:?}");
}

#[sqlx::test(migrations = false)]
async fn without_a_token_only_loopback_names_are_answered(pool: PgPool) {
    migrated(&pool).await;
    emit_committed(&pool, &[placed(1)]).await;
    let served = Served::start(Console::new(pool.clone()).router()).await;
    let port = served.address.port();
    let http = client();
    for host in ["localhost", "127.0.0.1", "[::1]"] {
        let response =
            http.get(&served.url).header("host", format!("{host}:{port}")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{host}");
    }
    // A page of another site that rebinds its name to 127.0.0.1 sends its own name as Host.
    for path in ["/", "/api/overview", "/dead"] {
        let response = http
            .get(format!("{}{path}", served.url))
            .header("host", format!("rebound.example:{port}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{path}");
        assert_secure(&response);
        let body = response.text().await.unwrap();
        assert!(body.contains("loopback") && !body.contains("pending"), "{body}");
    }
    // A reverse proxy on the machine connects over loopback for anyone: its headers say so.
    for header in ["x-forwarded-for", "x-real-ip", "forwarded"] {
        let response = http
            .get(format!("{}/api/overview", served.url))
            .header(header, "203.0.113.7")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{header}");
    }
    let css = http
        .get(format!("{}/assets/console.css", served.url))
        .header("host", format!("rebound.example:{port}"))
        .send()
        .await
        .unwrap();
    assert_eq!(css.status(), StatusCode::FORBIDDEN, "not even the stylesheet");
}

#[sqlx::test(migrations = false)]
async fn a_read_only_console_serves_no_action(pool: PgPool) {
    migrated(&pool).await;
    let dead = dead_row(&pool, "order", "order.placed", "refused").await;
    let served =
        Served::start(Console::new(pool.clone()).token(TOKEN).read_only(true).router()).await;
    let http = client();
    let cookie = logged_in(&served).await;
    for page in ["/dead", "/control", &format!("/events/{dead}")] {
        let response =
            http.get(format!("{}{page}", served.url)).header(COOKIE, &cookie).send().await.unwrap();
        let body = response.text().await.unwrap();
        assert!(body.contains("read-only"), "{page}");
        for action in ["Requeue", "Discard", "action=\"/control/pause\"", "Count…"] {
            assert!(!body.contains(action), "{page} offers {action}");
        }
    }
    for path in
        ["/dead/requeue", "/dead/discard", "/control/pause", "/control/resume", "/control/replay"]
    {
        let response = http
            .post(format!("{}{path}", served.url))
            .header(COOKIE, &cookie)
            .form(&[("event_id", dead.to_string())])
            .send()
            .await
            .unwrap();
        assert!(response.status().is_client_error(), "{path}: {}", response.status());
    }
    for path in ["/api/dead/requeue", "/api/pause", "/api/replay"] {
        let response = http
            .post(format!("{}{path}", served.url))
            .bearer_auth(TOKEN)
            .json(&serde_json::json!({ "aggregate_type": "order", "event_type": "order.placed" }))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_client_error(), "{path}: {}", response.status());
    }
    assert!(row_state(&pool, dead).await.dead);
    assert!(pauses::paused(&pool).await.unwrap().is_empty());
}

#[sqlx::test(migrations = false)]
async fn a_confirmed_action_touches_what_the_confirmation_counted(pool: PgPool) {
    migrated(&pool).await;
    for _ in 0..3 {
        dead_row(&pool, "order", "order.placed", "timeout after 30s").await;
    }
    let other = dead_row(&pool, "order", "order.placed", "refused").await;
    let served = Served::start(Console::new(pool.clone()).router()).await;
    let http = client();
    let confirm = format!("{}/dead/confirm?action=discard&error=TIMEOUT&newer_than=1h", served.url);
    let response = http.get(&confirm).send().await.unwrap();
    let cookie = session_cookie(&response).unwrap();
    let page = response.text().await.unwrap();
    assert!(page.contains("discard 3 dead letters"), "{page}");
    // A letter that dies after the confirmation was shown is not part of it.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let late = dead_row(&pool, "order", "order.placed", "timeout again").await;
    let fields = form_fields(&page, "/dead/discard");
    let done = http
        .post(format!("{}/dead/discard", served.url))
        .header(COOKIE, &cookie)
        .form(&fields)
        .send()
        .await
        .unwrap();
    assert!(done.text().await.unwrap().contains("Discarded 3 dead letters"));
    let left: Vec<_> = dead_letters::list(&pool, &dead_letters::DeadFilter::all(), None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|event| event.event_id)
        .collect();
    assert_eq!(left, vec![other, late]);
}

#[sqlx::test(migrations = false)]
async fn mounted_under_a_path_its_links_redirects_and_cookie_follow(pool: PgPool) {
    migrated(&pool).await;
    let console = Console::new(pool.clone()).token(TOKEN).router();
    let served = Served::start(axum::Router::new().nest("/ops/outbox", console)).await;
    let http = client();
    let response = http.get(format!("{}/ops/outbox/dead", served.url)).send().await.unwrap();
    assert_eq!(response.headers()[LOCATION], "/ops/outbox/login");
    let response = http
        .post(format!("{}/ops/outbox/login", served.url))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()[LOCATION], "/ops/outbox");
    assert!(response.headers()[SET_COOKIE].to_str().unwrap().contains("Path=/ops/outbox;"));
    let cookie = session_cookie(&response).unwrap();
    let page = http
        .get(format!("{}/ops/outbox", served.url))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    let page = page.text().await.unwrap();
    for link in [
        "href=\"/ops/outbox/assets/console.css\"",
        "href=\"/ops/outbox/dead\"",
        "href=\"/ops/outbox\"",
    ] {
        assert!(page.contains(link), "{link} in {page}");
    }
    let css =
        http.get(format!("{}/ops/outbox/assets/console.css", served.url)).send().await.unwrap();
    assert_eq!(css.headers()["content-type"], "text/css; charset=utf-8");
}

#[sqlx::test(migrations = false)]
async fn payloads_and_errors_are_shown_as_text_never_as_markup(pool: PgPool) {
    migrated(&pool).await;
    let dead = dead_row(&pool, "order", "order.placed", "<img src=x onerror=alert(1)>").await;
    sqlx::query("UPDATE outbox.events SET payload = '{\"note\": \"<script>alert(2)</script>\"}' WHERE event_id = $1")
        .bind(dead)
        .execute(&pool)
        .await
        .unwrap();
    let served = Served::start(Console::new(pool.clone()).router()).await;
    let http = client();
    for page in [format!("/events/{dead}"), "/dead".to_owned()] {
        let body =
            http.get(format!("{}{page}", served.url)).send().await.unwrap().text().await.unwrap();
        assert!(!body.contains("<script>") && !body.contains("<img"), "{page}: {body}");
        assert!(body.contains("&lt;img src=x onerror=alert(1)&gt;"), "{page}: {body}");
    }
}

#[sqlx::test(migrations = false)]
async fn the_api_reads_and_acts_with_the_token(pool: PgPool) {
    migrated(&pool).await;
    let timeouts = [
        dead_row(&pool, "order", "order.placed", "timeout").await,
        dead_row(&pool, "order", "order.placed", "timeout").await,
    ];
    let refused = dead_row(&pool, "customer", "customer.renamed", "refused").await;
    let served = Served::start(Console::new(pool.clone()).token(TOKEN).router()).await;
    let http = client();
    let call = |method: reqwest::Method, path: &str| {
        http.request(method, format!("{}/api/{path}", served.url)).bearer_auth(TOKEN)
    };

    let dead: Value =
        call(reqwest::Method::GET, "dead?error=time").send().await.unwrap().json().await.unwrap();
    assert_eq!(dead["count"], 2);
    assert_eq!(dead["events"][0]["event_id"], timeouts[0].to_string());
    assert_eq!(dead["events"][0]["payload"]["total_cents"], 4200);
    let event: Value = call(reqwest::Method::GET, &format!("events/{refused}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(event["state"], "dead");
    let missing =
        call(reqwest::Method::GET, &format!("events/{}", uuid::Uuid::nil())).send().await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let bad = call(reqwest::Method::GET, "dead?newer_than=soon").send().await.unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    let bad: Value = bad.json().await.unwrap();
    assert!(bad["error"].as_str().unwrap().contains("30m, 2h or 7d"), "{bad}");

    let requeued: Value = call(reqwest::Method::POST, "dead/requeue")
        .json(&serde_json::json!({ "error": "timeout" }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(requeued["requeued"], 2);
    assert!(!row_state(&pool, timeouts[1]).await.dead && row_state(&pool, refused).await.dead);

    let body = serde_json::json!({ "aggregate_type": "order", "event_type": "order.placed", "reason": "mailer down" });
    let paused = answer(call(reqwest::Method::POST, "pause").json(&body)).await;
    assert_eq!(paused["paused"], true);
    let listed = pauses::paused(&pool).await.unwrap();
    assert_eq!(listed[0].reason.as_deref(), Some("mailer down"));
    let resumed = answer(call(reqwest::Method::POST, "resume").json(&body)).await;
    assert_eq!(resumed["resumed"], true);
    assert!(pauses::paused(&pool).await.unwrap().is_empty());
}

#[sqlx::test(migrations = false)]
async fn an_aggregates_page_lists_what_holds_it_back_and_all_with_the_optional_index(pool: PgPool) {
    migrated(&pool).await;
    let order = uuid::Uuid::now_v7();
    // Ordered events of one aggregate: the first dead (it holds the others back), one delivered.
    let rows: Vec<Uuid> = sqlx::query_scalar(
        "SELECT outbox.emit('order', $1, 'order.placed', jsonb_build_object('n', n), ordered => true) \
         FROM generate_series(1, 3) AS n",
    )
    .bind(order.to_string())
    .fetch_all(&pool)
    .await
    .unwrap();
    mark_dead(&pool, rows[0], "refused").await;
    emit_committed(&pool, &[OrderPlaced { order_id: order, total_cents: 1 }]).await;
    sqlx::query("UPDATE outbox.events SET published_at = now() WHERE ordered = false")
        .execute(&pool)
        .await
        .unwrap();
    let served = Served::start(Console::new(pool.clone()).router()).await;
    let http = client();
    let url = format!("{}/aggregate?aggregate_type=order&aggregate_id={order}", served.url);

    let page = http.get(&url).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("id=\"incomplete\""), "{page}");
    let listed: Vec<usize> =
        rows.iter().map(|id| page.find(&id.to_string()).expect("listed")).collect();
    assert!(listed.windows(2).all(|pair| pair[0] < pair[1]), "in emit order");
    assert!(page.contains("class=\"state dead\""));

    sqlx::raw_sql(
        "CREATE INDEX events_by_aggregate ON outbox.events (aggregate_type, aggregate_id, seq)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let api: Value = http
        .get(format!("{}/api/aggregate?aggregate_type=order&aggregate_id={order}", served.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(api["complete"], true);
    assert_eq!(api["events"].as_array().unwrap().len(), 4, "the delivered one too: {api}");
    assert_eq!(api["events"][3]["state"], "published");
}

#[sqlx::test(migrations = false)]
async fn the_overview_stands_without_its_charts_when_they_cannot_be_read(pool: PgPool) {
    migrated(&pool).await;
    emit_committed(&pool, &[placed(1)]).await;
    // As for a console role without the grant on outbox.activity: the charts' read fails.
    sqlx::raw_sql("ALTER TABLE outbox.activity RENAME TO activity_elsewhere")
        .execute(&pool)
        .await
        .unwrap();
    let served = Served::start(Console::new(pool.clone()).router()).await;
    let response = client().get(&served.url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let page = response.text().await.unwrap();
    assert!(page.contains("id=\"pending\">1<"), "{page}");
    assert!(
        page.contains("id=\"charts-unavailable\"") && page.contains("outbox.activity"),
        "{page}"
    );
}

#[sqlx::test(migrations = false)]
async fn dead_letters_show_and_select_a_subscribers_copies(pool: PgPool) {
    migrated(&pool).await;
    let plain = dead_row(&pool, "order", "order.placed", "refused").await;
    // A subscriber's dead copy of an event, as a relay writes one.
    let copy: Uuid = sqlx::query_scalar(
        "INSERT INTO outbox.events (source_event_id, subscriber, aggregate_type, aggregate_id, \
                                    event_type, payload, attempts, last_error, dead_at) \
         VALUES (gen_random_uuid(), 'audit', 'order', '7', 'order.placed', '{}', 3, \
                 'the audit log refuses it', now()) \
         RETURNING event_id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let served = Served::start(Console::new(pool.clone()).token(TOKEN).router()).await;
    let http = client();
    let api = |path: &str| http.get(format!("{}/api/{path}", served.url)).bearer_auth(TOKEN);

    let dead = answer(api("dead?subscriber=audit")).await;
    assert_eq!(dead["count"], 1);
    assert_eq!(dead["events"][0]["event_id"], copy.to_string());
    assert_eq!(dead["events"][0]["subscriber"], "audit");
    let all = answer(api("dead")).await;
    assert_eq!(all["count"], 2);

    let cookie = logged_in(&served).await;
    let page = http
        .get(format!("{}/dead?subscriber=audit", served.url))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(&copy.to_string()) && !page.contains(&plain.to_string()), "{page}");
    assert!(page.contains("<td class=\"subscriber\">audit</td>"), "{page}");
    assert!(page.contains("1 dead letter matches"), "{page}");
    // Requeuing from the page's selection touches the subscriber's copy alone.
    let requeued = answer(
        http.post(format!("{}/api/dead/requeue", served.url))
            .bearer_auth(TOKEN)
            .json(&serde_json::json!({ "subscriber": "audit" })),
    )
    .await;
    assert_eq!(requeued["requeued"], 1);
    assert!(!row_state(&pool, copy).await.dead && row_state(&pool, plain).await.dead);
}
