//! The pages that show: overview, relays, an event; the login; the stylesheet.

use axum::extract::{Form, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Duration, Utc};
use maud::{html, Markup};
use serde::Deserialize;

use super::auth;
use super::chart::Window;
use super::extract::{Action, Page};
use super::filters::{event_id, AggregateQuery, AGGREGATE_PAGE_SIZE};
use super::overview;
use super::problem::Problem;
use super::views::{self, age, count, instant, layout, Section};
use crate::events::{self, EventState};
use crate::relays::RelayStatus;

pub(super) async fn overview(
    page: Page,
    State(console): State<super::State>,
) -> Result<Markup, Problem> {
    let now = Utc::now();
    let reading = overview::read(&console.pool, now).await?;
    let stats = &reading.stats;
    let silent = reading.relays.iter().filter(|relay| relay.silent).count();
    let body = html! {
        section.cards {
            div.card { span.label { "Pending" } span.value #pending { (count(stats.pending)) } }
            div.card { span.label { "Dead" } span.value #dead { a href=(page.link("/dead")) { (count(stats.dead)) } } }
            div.card { span.label { "Delivered, last hour" } span.value #delivered { (count(reading.delivered_last_hour)) } }
            div.card { span.label { "Lag" } span.value #lag { (stats.oldest_pending_age.map_or("none".to_owned(), age)) } }
            div.card {
                span.label { "Relays" }
                span.value #relays { a href=(page.link("/relays")) { (reading.relays.len() - silent) } }
                @if silent > 0 { span.warning { (silent) " silent" } }
            }
        }
        @if let Some(error) = &reading.activity_error {
            p.warning #charts-unavailable { "The charts cannot be read: " (error) }
        } @else {
            (charts(&reading.activity, now))
        }
        @if !reading.paused.is_empty() {
            p.warning {
                "Paused: "
                @for (i, paused) in reading.paused.iter().enumerate() {
                    @if i > 0 { ", " }
                    (views::event_type(&paused.aggregate_type, &paused.event_type))
                }
                " (" a href=(page.link("/control")) { "control" } ")"
            }
        }
        h2 { "By type and version" }
        @if reading.by_type.is_empty() {
            p { "Nothing pending and no dead letters." }
        } @else {
            table #by-type {
                thead { tr { th { "Type" } th { "Version" } th.n { "Pending" } th.n { "Dead" } th.n { "Oldest pending" } } }
                tbody {
                    @for row in &reading.by_type {
                        tr {
                            td { (views::event_type(&row.aggregate_type, &row.event_type)) }
                            td { (row.version) }
                            td.n { (count(row.pending)) }
                            td.n {
                                @if row.dead > 0 {
                                    a href={(page.link("/dead")) "?aggregate_type=" (urlencode(&row.aggregate_type)) "&event_type=" (urlencode(&row.event_type))} { (count(row.dead)) }
                                } @else { "0" }
                            }
                            td.n { (row.oldest_pending_age.map_or(String::new(), age)) }
                        }
                    }
                }
            }
        }
        p.muted { "Read at " (instant(&now)) ". Reload for a new reading." }
    };
    Ok(layout(&page, Section::Overview, "Overview", body))
}

/// Deliveries and lag over the last hour (per minute) and day (per 15 minutes), as the relays
/// recorded them.
fn charts(activity: &[overview::Minute], now: DateTime<Utc>) -> Markup {
    let delivered = || activity.iter().map(|m| (m.minute, m.delivered as f64));
    // A reading with nothing pending is a lag of zero; a minute without a reading is no data.
    let lag = || {
        activity
            .iter()
            .filter(|m| m.pending.is_some())
            .map(|m| (m.minute, m.oldest_pending_age_secs.unwrap_or(0.0)))
    };
    let sum = |a: f64, b: f64| a + b;
    let show_count = |value: f64| count(value as i64);
    let show_age = |value: f64| age(std::time::Duration::from_secs_f64(value.max(0.0)));
    let hour = Window::ending(now, Duration::minutes(1), 60);
    let day = Window::ending(now, Duration::minutes(15), 96);
    html! {
        @if activity.is_empty() {
            p.muted { "No relay recorded its activity in the last day: the charts fill as relays of this version run." }
        }
        section.charts {
            div { h2 { "Delivered per minute, last hour" } (hour.bars(&hour.collect(delivered(), sum), "events delivered per minute", show_count)) }
            div { h2 { "Lag, last hour" } (hour.bars(&hour.collect(lag(), f64::max), "age of the oldest pending event", show_age)) }
            div { h2 { "Delivered per 15 minutes, last day" } (day.bars(&day.collect(delivered(), sum), "events delivered per 15 minutes", show_count)) }
            div { h2 { "Lag, last day" } (day.bars(&day.collect(lag(), f64::max), "highest lag per 15 minutes", show_age)) }
        }
    }
}

pub(super) async fn relays(
    page: Page,
    State(console): State<super::State>,
) -> Result<Markup, Problem> {
    let relays = crate::relays::relays(&console.pool).await?;
    let body = html! {
        @if relays.is_empty() {
            p { "No relay is running: none has a heartbeat (every 5 s) in the outbox." }
        } @else {
            table #relays {
                thead { tr {
                    th { "Relay" } th { "Host" } th.n { "Pid" } th { "Version" } th { "Lease mode" }
                    th { "Takes" } th { "Started" } th { "Heartbeat" } th.n { "Held" } th.n { "Delivered" }
                } }
                tbody { @for relay in &relays { (relay_row(relay)) } }
            }
        }
        p.muted { "A relay silent for over 15 s died, hangs or cannot reach the database; a relay that stopped gracefully is not listed." }
    };
    Ok(layout(&page, Section::Relays, "Relays", body))
}

fn relay_row(relay: &RelayStatus) -> Markup {
    html! {
        tr.silent[relay.silent] {
            td { code { (relay.relay_id.simple().to_string().get(..8).unwrap_or_default()) } }
            td { (relay.host) }
            td.n { (relay.pid) }
            td { (relay.version) }
            td { (relay.lease_mode) }
            td {
                @for handled in &relay.handles { code { (handled) } " " }
                @if let Some(forwards) = &relay.forwards {
                    "forwards " @for forwarded in forwards { code { (forwarded) } " " }
                }
            }
            td { (instant(&relay.started_at)) }
            td {
                @if relay.silent { span.warning { "silent for " (age(relay.since_heartbeat)) } }
                @else { (age(relay.since_heartbeat)) " ago" }
            }
            td.n { (count(relay.held)) }
            td.n { (count(relay.delivered)) }
        }
    }
}

#[derive(Deserialize)]
pub(super) struct FindEvent {
    id: Option<String>,
}

pub(super) async fn find_event(page: Page, Query(find): Query<FindEvent>) -> Response {
    if let Some(id) = find.id.as_deref().map(str::trim).filter(|id| !id.is_empty()) {
        return match event_id(id) {
            Ok(id) => Redirect::to(&page.link(&format!("/events/{id}"))).into_response(),
            Err(problem) => problem.into_response(),
        };
    }
    let body = html! {
        form.inline method="get" action=(page.link("/events")) {
            label { "Event id " input type="text" name="id" size="40" required autofocus; }
            button type="submit" { "Look up" }
        }
        p.muted { "Any event the table still holds, whatever its state. Published events are kept until purged; with delete_on_publish they are gone once delivered." }
        h2 { "An aggregate's events" }
        form.inline method="get" action=(page.link("/aggregate")) {
            label { "Aggregate type " input type="text" name="aggregate_type" required; }
            label { "Aggregate id " input type="text" name="aggregate_id" required; }
            button type="submit" { "List" }
        }
    };
    layout(&page, Section::Events, "Find an event", body).into_response()
}

pub(super) async fn event(
    page: Page,
    State(console): State<super::State>,
    Path(id): Path<String>,
) -> Result<Markup, Problem> {
    let id = event_id(&id)?;
    let Some(event) = events::get(&console.pool, id).await? else {
        return Err(Problem::NotFound(format!(
            "no event {id} in the outbox: it was never emitted here, or it was purged, \
             discarded, or deleted on publish"
        )));
    };
    let body = html! {
        dl.fields #event {
            dt { "State" } dd #state { (state_badge(event.state)) }
            dt { "Type" } dd { (views::event_type(&event.aggregate_type, &event.event_type)) " version " (event.version) }
            dt { "Aggregate id" } dd {
                a href={(page.link("/aggregate")) "?aggregate_type=" (urlencode(&event.aggregate_type)) "&aggregate_id=" (urlencode(&event.aggregate_id))} { code { (event.aggregate_id) } }
                @if event.ordered { " (ordered)" }
            }
            @if let Some(key) = &event.idempotency_key { dt { "Idempotency key" } dd { code { (key) } } }
            dt { "Emitted" } dd { (instant(&event.created_at)) }
            dt { "Available" } dd { (instant(&event.available_at)) }
            @if let Some(at) = &event.published_at { dt { "Published" } dd { (instant(at)) } }
            @if let Some(at) = &event.dead_at { dt { "Dead since" } dd { (instant(at)) } }
            dt { "Attempts" } dd #attempts { (event.attempts) }
            dt { "Expired leases" } dd { (event.expired_leases) }
            @if let Some(error) = &event.last_error { dt { "Last error" } dd { pre.error { (error) } } }
        }
        @if event.state == EventState::Dead && !page.read_only {
            p { a.button href={(page.link("/dead/confirm")) "?action=requeue&event_id=" (event.event_id)} { "Requeue…" } " "
                a.button href={(page.link("/dead/confirm")) "?action=discard&event_id=" (event.event_id)} { "Discard…" } }
        }
        h2 { "Payload" }
        pre.json #payload { (pretty(&event.payload)) }
        h2 { "Headers" }
        pre.json #headers { (pretty(&event.headers)) }
    };
    Ok(layout(&page, Section::Events, &format!("Event {id}"), body))
}

pub(super) async fn aggregate(
    page: Page,
    State(console): State<super::State>,
    Query(query): Query<AggregateQuery>,
) -> Result<Markup, Problem> {
    let (aggregate_type, aggregate_id) = (query.aggregate_type.trim(), query.aggregate_id.trim());
    let pool = &console.pool;
    let found =
        events::of_aggregate(pool, aggregate_type, aggregate_id, AGGREGATE_PAGE_SIZE).await?;
    let body = html! {
        @if !found.complete {
            p.muted #incomplete {
                "Only the undelivered events of ordered types are shown: what holds the aggregate back. "
                "For every event, create the index " code { (events::AGGREGATE_INDEX) } ": "
                code { (events::AGGREGATE_INDEX_SQL) }
                " (every emit then writes one more index entry)."
            }
        }
        @if found.events.len() == AGGREGATE_PAGE_SIZE as usize {
            p.warning { "The first " (AGGREGATE_PAGE_SIZE) " events are shown; the aggregate may have more." }
        }
        @if found.events.is_empty() {
            p { "No event of this aggregate is shown." }
        } @else {
            table #aggregate {
                thead { tr { th { "Event" } th { "Type" } th { "State" } th.n { "Attempts" } th { "Emitted" } th { "Last error" } } }
                tbody {
                    @for event in &found.events {
                        tr {
                            td { (views::event_link(&page, &event.event_id)) }
                            td { code { (event.event_type) } " v" (event.version) @if event.ordered { " (ordered)" } }
                            td { (state_badge(event.state)) }
                            td.n { (event.attempts) }
                            td { (instant(&event.created_at)) }
                            td.error { (event.last_error.as_deref().unwrap_or_default()) }
                        }
                    }
                }
            }
        }
    };
    let title = format!("Aggregate {aggregate_type} {aggregate_id}");
    Ok(layout(&page, Section::Events, &title, body))
}

fn state_badge(state: EventState) -> Markup {
    let name = match state {
        EventState::Pending => "pending",
        EventState::Leased => "leased",
        EventState::Waiting => "waiting",
        EventState::Published => "published",
        EventState::Dead => "dead",
    };
    html! { span class={"state " (name)} { (name) } }
}

fn pretty(value: &serde_json::Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// A query-string value, percent-encoded.
pub(super) fn urlencode(value: &str) -> String {
    serde_urlencoded::to_string([("", value)])
        .map(|pair| pair.trim_start_matches('=').to_owned())
        .unwrap_or_default()
}

#[derive(Deserialize)]
pub(super) struct Login {
    token: String,
}

pub(super) async fn login_form(page: Page, State(console): State<super::State>) -> Response {
    if !console.keys.has_token() || page.logged_in {
        return Redirect::to(&page.link("")).into_response();
    }
    login_page(&page, None).into_response()
}

pub(super) async fn login(
    page: Page,
    State(console): State<super::State>,
    headers: HeaderMap,
    Form(login): Form<Login>,
) -> Response {
    if !console.keys.has_token() {
        return Redirect::to(&page.link("")).into_response();
    }
    if !console.keys.is_token(&login.token) {
        let refused = "That is not the console's token: copy it from OUTBOX_CONSOLE_TOKEN.";
        return (StatusCode::UNAUTHORIZED, login_page(&page, Some(refused))).into_response();
    }
    let cookie = auth::session_cookie(Some(&console.keys.new_session()), &page.base, &headers);
    ([(header::SET_COOKIE, cookie)], Redirect::to(&page.link(""))).into_response()
}

fn login_page(page: &Page, refused: Option<&str>) -> Markup {
    let body = html! {
        @if let Some(refused) = refused { p.problem { (refused) } }
        form.login method="post" action=(page.link("/login")) {
            label { "Token " input type="password" name="token" autocomplete="current-password" required autofocus; }
            button type="submit" { "Log in" }
        }
    };
    let page = Page { logged_in: false, ..page.clone() };
    layout(&page, Section::Overview, "Log in", body)
}

/// A form with no fields but its CSRF token.
#[derive(Deserialize)]
pub(super) struct Nothing {}

pub(super) async fn logout(
    page: Page,
    headers: HeaderMap,
    Action(Nothing {}): Action<Nothing>,
) -> Response {
    let cookie = auth::session_cookie(None, &page.base, &headers);
    ([(header::SET_COOKIE, cookie)], Redirect::to(&page.link("/login"))).into_response()
}

pub(super) async fn stylesheet() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], include_str!("console.css"))
}

pub(super) async fn not_found() -> Problem {
    Problem::NotFound("no such page in the outbox console: start from its overview".into())
}
