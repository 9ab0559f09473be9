//! The console in a real browser (Debian's Chromium, headless, through chromedriver), against a
//! running relay: log in, read the overview, requeue a dead letter and watch it delivered, pause
//! a type and watch the relay stop taking it. Each test saves screenshots in
//! `target/console-screenshots/` for a reviewer.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fantoccini::Locator;
use outbox_runtime::console::Console;
use outbox_runtime::{EventContext, Relay};
use sqlx::PgPool;
use support::browser::Browser;
use support::console::Served;
use support::*;
use uuid::Uuid;

const TOKEN: &str = "a-console-token-for-the-browser-tests-42";

/// Every event the relay's handler took.
#[derive(Clone, Default)]
struct Handled(Arc<Mutex<Vec<Uuid>>>);

impl Handled {
    fn contains(&self, id: Uuid) -> bool {
        self.0.lock().unwrap().contains(&id)
    }
}

async fn on_placed(ctx: EventContext<Handled>, _: OrderPlaced) -> Result<(), HandlerError> {
    ctx.state().0.lock().unwrap().push(ctx.event_id());
    Ok(())
}

fn relay(pool: &PgPool, handled: &Handled) -> Running {
    Running::start(fast(Relay::builder(pool.clone()).state(handled.clone()).handler(on_placed)))
}

/// An event emitted and then made a dead letter, as a relay leaves one.
async fn dead_event(pool: &PgPool) -> Uuid {
    let id = emit_committed(pool, &[placed(4200)]).await[0];
    sqlx::query(
        "UPDATE outbox.events SET dead_at = now(), attempts = 10, \
                last_error = 'payment service answered 503: retry later' WHERE event_id = $1",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    id
}

/// The text of the element `css`, waiting (up to 30 s) for it to appear: a click or a form
/// submission returns before the page it leads to has loaded.
async fn text(browser: &Browser, css: &str) -> String {
    let element = browser.client.wait().for_element(Locator::Css(css)).await.unwrap();
    element.text().await.unwrap()
}

async fn log_in(browser: &Browser, served: &Served) {
    browser.client.goto(&format!("{}/", served.url)).await.unwrap();
    assert_eq!(browser.client.current_url().await.unwrap().path(), "/login");
    browser.screenshot("login").await;
    let form = browser.client.form(Locator::Css("form.login")).await.unwrap();
    form.set_by_name("token", TOKEN).await.unwrap().submit().await.unwrap();
    // Logged in once the overview is there.
    browser.client.wait().for_element(Locator::Css("#pending")).await.unwrap();
}

/// Reloads `path` until the element `css` reads `expected`.
async fn until_text(browser: &Browser, url: &str, css: &str, expected: &str) {
    for _ in 0..100 {
        browser.client.goto(url).await.unwrap();
        if text(browser, css).await == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{css} on {url} never read {expected:?}: {:?}", text(browser, css).await);
}

#[sqlx::test(migrations = false)]
async fn an_operator_logs_in_and_the_overview_matches_the_database(pool: PgPool) {
    migrated(&pool).await;
    emit_committed(&pool, &[placed(1), placed(2), placed(3)]).await;
    dead_event(&pool).await;
    dead_event(&pool).await;
    // A day of relays' activity, as their heartbeats record it: a daily curve of deliveries,
    // and a lag that rose for a while two hours ago.
    sqlx::query(
        "INSERT INTO outbox.activity (minute, delivered, pending, dead, oldest_pending_age_secs, read) \
         SELECT date_trunc('minute', now()) - m * interval '1 minute', \
                (600 + 400 * sin(m / 229.0))::int8, 40, 2, \
                CASE WHEN m BETWEEN 100 AND 140 THEN 30 + (m - 100) * 4 ELSE 0.4 END, true \
         FROM generate_series(1, 1439) AS m",
    )
    .execute(&pool)
    .await
    .unwrap();
    // The last hour's deliveries, read before and after the page: a minute that begins
    // meanwhile moves the hour by a row, so the page shows one of the two.
    let delivered = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT sum(delivered)::int8 FROM outbox.activity \
             WHERE minute > now() - interval '1 hour'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
        .to_string()
    };
    let delivered_before = delivered().await;
    let served = Served::start(Console::new(pool.clone()).token(TOKEN).router()).await;
    let browser = Browser::start().await;
    log_in(&browser, &served).await;

    assert_eq!(browser.client.current_url().await.unwrap().path(), "/");
    let stats = outbox_runtime::stats(&pool).await.unwrap();
    assert_eq!(text(&browser, "#pending").await, stats.pending.to_string());
    assert_eq!(text(&browser, "#dead").await, stats.dead.to_string());
    let shown = text(&browser, "#delivered").await.replace(',', "");
    let delivered_after = delivered().await;
    assert!(
        shown == delivered_before || shown == delivered_after,
        "{shown} delivered in the last hour, read {delivered_before} before, {delivered_after} after"
    );
    let by_type = text(&browser, "#by-type").await;
    assert!(by_type.contains("order / order.placed"), "{by_type}");
    browser.screenshot("overview").await;
    browser.close().await;
}

#[sqlx::test(migrations = false)]
async fn a_requeued_dead_letter_is_delivered_by_the_running_relay(pool: PgPool) {
    migrated(&pool).await;
    let id = dead_event(&pool).await;
    let handled = Handled::default();
    let relay = relay(&pool, &handled);
    let served = Served::start(Console::new(pool.clone()).token(TOKEN).router()).await;
    let browser = Browser::start().await;
    log_in(&browser, &served).await;

    browser.client.goto(&format!("{}/dead", served.url)).await.unwrap();
    assert_eq!(text(&browser, "#matching").await, "1 dead letter matches.");
    assert!(text(&browser, "#dead").await.contains("payment service answered 503"));
    browser.screenshot("dead-letters").await;
    browser.client.find(Locator::LinkText("Requeue 1…")).await.unwrap().click().await.unwrap();
    assert!(text(&browser, "#confirm").await.contains("requeue 1 dead letter"));
    browser.screenshot("dead-letters-confirm").await;
    browser
        .client
        .find(Locator::Css("#act button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    assert_eq!(text(&browser, "#done").await, "Requeued 1 dead letters.");

    let event = format!("{}/events/{id}", served.url);
    until_text(&browser, &event, "#state", "published").await;
    assert!(handled.contains(id), "the relay's handler took the requeued event");
    browser.screenshot("event").await;
    relay.stop().await;
    browser.close().await;
}

#[sqlx::test(migrations = false)]
async fn a_paused_type_is_not_taken_by_the_running_relay_until_resumed(pool: PgPool) {
    migrated(&pool).await;
    let handled = Handled::default();
    let relay = relay(&pool, &handled);
    let served = Served::start(Console::new(pool.clone()).token(TOKEN).router()).await;
    let browser = Browser::start().await;
    log_in(&browser, &served).await;

    browser.client.goto(&format!("{}/control", served.url)).await.unwrap();
    let form = browser.client.form(Locator::Css("form#pause")).await.unwrap();
    form.set_by_name("aggregate_type", "order").await.unwrap();
    form.set_by_name("event_type", "order.placed").await.unwrap();
    form.set_by_name("reason", "payment service down").await.unwrap();
    form.submit().await.unwrap();
    let paused = text(&browser, "#paused").await;
    assert!(
        paused.contains("order / order.placed") && paused.contains("payment service down"),
        "{paused}"
    );
    browser.screenshot("control-paused").await;

    // Emitted while paused: the relay, polling every few milliseconds, leaves it pending.
    let id = emit_committed(&pool, &[placed(7)]).await[0];
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!handled.contains(id), "a paused type's event was delivered");
    let state = row_state(&pool, id).await;
    assert!(!state.published && !state.leased, "{state:?}");
    browser.client.goto(&format!("{}/", served.url)).await.unwrap();
    assert!(text(&browser, "p.warning").await.contains("order / order.placed"));
    browser.client.goto(&format!("{}/relays", served.url)).await.unwrap();
    assert!(text(&browser, "#relays").await.contains("written"), "the running relay is listed");
    browser.screenshot("relays").await;

    browser.client.goto(&format!("{}/control", served.url)).await.unwrap();
    browser
        .client
        .find(Locator::Css("#paused button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until_published(&pool, id).await;
    assert!(handled.contains(id));
    relay.stop().await;
    browser.close().await;
}
