//! The pages that act: dead letters (filter, requeue, discard) and control (pause, resume,
//! replay). Each action that touches many rows goes through a confirmation page that counts
//! them first and pins the selection's time range, so the action touches what was counted.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use chrono::Utc;
use maud::{html, Markup};
use serde::Deserialize;

use super::extract::{Action, Page};
use super::filters::{
    given, DeadLetters, DeadPage, DeadQuery, ReplayQuery, TypeForm, DEAD_PAGE_SIZE,
};
use super::problem::Problem;
use super::views::{self, count, csrf, instant, layout, Section};
use crate::{dead_letters, pauses, replay};

pub(super) async fn dead(
    page: Page,
    State(console): State<super::State>,
    Query(dead_page): Query<DeadPage>,
) -> Result<Markup, Problem> {
    let DeadLetters { matching, events, next } = dead_page.read(&console.pool, Utc::now()).await?;
    let query = &dead_page.query;
    let body = html! {
        form.filters method="get" action=(page.link("/dead")) {
            label { "Aggregate type " input type="text" name="aggregate_type" value=[given(&query.aggregate_type)]; }
            label { "Event type " input type="text" name="event_type" value=[given(&query.event_type)]; }
            label { "Error contains " input type="text" name="error" value=[given(&query.error)]; }
            label { "Subscriber " input type="text" name="subscriber" size="12" value=[given(&query.subscriber)]; }
            label { "Died less than " input type="text" name="newer_than" size="6" placeholder="2h" value=[given(&query.newer_than)]; " ago" }
            label { "more than " input type="text" name="older_than" size="6" placeholder="10m" value=[given(&query.older_than)]; " ago" }
            button type="submit" { "Filter" }
            " " a href=(page.link("/dead")) { "Clear" }
        }
        p #matching { (count(matching)) " dead letter" @if matching != 1 { "s" } " match" @if matching == 1 { "es" } "." }
        @if matching > 0 && !page.read_only {
            p.actions {
                a.button href={(page.link("/dead/confirm")) "?action=requeue&" (query.query_string())} { "Requeue " (count(matching)) "…" }
                " "
                a.button.danger href={(page.link("/dead/confirm")) "?action=discard&" (query.query_string())} { "Discard " (count(matching)) "…" }
            }
        }
        @if !events.is_empty() {
            table #dead {
                thead { tr { th { "Event" } th { "Type" } th { "Subscriber" } th { "Aggregate id" } th.n { "Attempts" } th { "Died" } th { "Last error" } } }
                tbody {
                    @for event in &events {
                        tr {
                            td { (views::event_link(&page, &event.event_id)) }
                            td { (views::event_type(&event.aggregate_type, &event.event_type)) " v" (event.version) }
                            td.subscriber { (event.subscriber.as_deref().unwrap_or("—")) }
                            td { code { (event.aggregate_id) } }
                            td.n { (event.attempts) @if event.expired_leases > 0 { " + " (event.expired_leases) " expired" } }
                            td { (instant(&event.dead_at)) }
                            td.error { (event.last_error.as_deref().map(shorten).unwrap_or_default()) }
                        }
                    }
                }
            }
        }
        @if let Some((pinned, after)) = next {
            p { a href={(page.link("/dead")) "?" (pinned.query_string()) "&after=" (after)} { "Next " (DEAD_PAGE_SIZE) " →" } }
        }
    };
    Ok(layout(&page, Section::Dead, "Dead letters", body))
}

/// The first line of an error, up to 120 characters.
fn shorten(error: &str) -> String {
    let line = error.lines().next().unwrap_or_default();
    match line.char_indices().nth(120) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line.to_owned(),
    }
}

/// What can be done to dead letters.
#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum DeadAction {
    Requeue,
    Discard,
}

impl DeadAction {
    fn verb(self) -> &'static str {
        match self {
            DeadAction::Requeue => "requeue",
            DeadAction::Discard => "discard",
        }
    }

    /// What the answer says it did.
    pub(super) fn done(self) -> &'static str {
        match self {
            DeadAction::Requeue => "requeued",
            DeadAction::Discard => "discarded",
        }
    }

    /// Does it to the selection; returns how many.
    pub(super) async fn apply(
        self,
        pool: &sqlx::PgPool,
        query: &DeadQuery,
    ) -> Result<u64, Problem> {
        let filter = query.select(Utc::now())?.filter;
        Ok(match self {
            DeadAction::Requeue => dead_letters::requeue(pool, &filter).await?,
            DeadAction::Discard => dead_letters::discard(pool, &filter).await?,
        })
    }
}

#[derive(Deserialize)]
pub(super) struct ConfirmDead {
    action: DeadAction,
    #[serde(flatten)]
    query: DeadQuery,
}

pub(super) async fn confirm_dead(
    page: Page,
    State(console): State<super::State>,
    Query(ConfirmDead { action, query }): Query<ConfirmDead>,
) -> Result<Markup, Problem> {
    let now = Utc::now();
    // Counted as pinned, the selection the form hands on: the same rows.
    let pinned = query.pinned(query.select(now)?.range, now);
    let selection = pinned.select(now)?;
    let matching = dead_letters::count(&console.pool, &selection.filter).await?;
    let until = selection.range.until.unwrap_or(now);
    let verb = action.verb();
    let body = html! {
        @if matching == 0 {
            p { "No dead letter matches: nothing to " (verb) "." }
        } @else {
            p #confirm {
                "This will " strong { (verb) " " (count(matching)) " dead letter" @if matching != 1 { "s" } }
                @if query.is_everything() { ": every dead letter" }
                " that died before " (instant(&until)) "."
                @if action == DeadAction::Discard { " Discarded events are deleted for good." }
                @else { " They become pending again and relays deliver them." }
            }
            form #act method="post" action=(page.link(&format!("/dead/{verb}"))) {
                (csrf(&page))
                @for (name, value) in pinned.fields() { input type="hidden" name=(name) value=(value); }
                button.danger[action == DeadAction::Discard] type="submit" { "Yes, " (verb) " " (count(matching)) }
                " " a href={(page.link("/dead")) "?" (query.query_string())} { "Cancel" }
            }
        }
    };
    let title = format!("{} dead letters?", capitalised(verb));
    Ok(layout(&page, Section::Dead, &title, body))
}

pub(super) async fn act_on_dead(
    page: Page,
    State(console): State<super::State>,
    Path(action): Path<DeadAction>,
    Action(query): Action<DeadQuery>,
) -> Result<Markup, Problem> {
    let done_to = action.apply(&console.pool, &query).await?;
    let what = format!("{} {} dead letters", capitalised(action.done()), count(done_to));
    Ok(done(&page, Section::Dead, &what, "/dead"))
}

/// The page after an action: what it did, and the way back.
fn done(page: &Page, section: Section, what: &str, back: &str) -> Markup {
    let body = html! { p #done { (what) "." } p { a href=(page.link(back)) { "Back" } } };
    layout(page, section, what, body)
}

fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    chars.next().map(|first| first.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

pub(super) async fn control(
    page: Page,
    State(console): State<super::State>,
) -> Result<Markup, Problem> {
    let (paused, by_type) =
        tokio::try_join!(pauses::paused(&console.pool), crate::stats_by_type(&console.pool))?;
    let body = html! {
        h2 { "Paused types" }
        @if paused.is_empty() {
            p { "Every type is delivered." }
        } @else {
            table #paused {
                thead { tr { th { "Type" } th { "Paused" } th { "Reason" } @if !page.read_only { th {} } } }
                tbody {
                    @for pause in &paused {
                        tr {
                            td { (views::event_type(&pause.aggregate_type, &pause.event_type)) }
                            td { (instant(&pause.paused_at)) }
                            td { (pause.reason.as_deref().unwrap_or_default()) }
                            @if !page.read_only {
                                td {
                                    form method="post" action=(page.link("/control/resume")) {
                                        (csrf(&page))
                                        input type="hidden" name="aggregate_type" value=(pause.aggregate_type);
                                        input type="hidden" name="event_type" value=(pause.event_type);
                                        button type="submit" { "Resume" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        @if !page.read_only {
            datalist #aggregate-types { @for row in &by_type { option value=(row.aggregate_type); } }
            datalist #event-types { @for row in &by_type { option value=(row.event_type); } }
            h2 { "Pause a type" }
            p.muted { "Every relay stops leasing its events with its next lease (within a second); events already leased are delivered. Its events wait pending until it is resumed." }
            form.filters #pause method="post" action=(page.link("/control/pause")) {
                (csrf(&page))
                label { "Aggregate type " input type="text" name="aggregate_type" list="aggregate-types" required; }
                label { "Event type " input type="text" name="event_type" list="event-types" required; }
                label { "Reason " input type="text" name="reason" placeholder="the mailer is down"; }
                button type="submit" { "Pause" }
            }
            h2 { "Replay published events" }
            p.muted { "Their rows become pending again: same event ids (consumers that deduplicate by id skip them), idempotency keys, payloads and headers; attempts start from zero; an aggregate's ordered events go out in their order, before its later pending ones. Only rows still kept can be replayed." }
            form.filters method="get" action=(page.link("/control/replay/confirm")) {
                label { "Aggregate type " input type="text" name="aggregate_type" list="aggregate-types" required; }
                label { "Event type " input type="text" name="event_type" list="event-types" required; }
                label { "Published less than " input type="text" name="newer_than" size="6" placeholder="2h" required; " ago" }
                label { "more than " input type="text" name="older_than" size="6" placeholder="10m"; " ago" }
                button type="submit" { "Count…" }
            }
        }
    };
    Ok(layout(&page, Section::Control, "Control", body))
}

pub(super) async fn pause(
    page: Page,
    State(console): State<super::State>,
    Action(form): Action<TypeForm>,
) -> Result<Response, Problem> {
    let (aggregate_type, event_type) = form.named()?;
    let reason = given(&form.reason);
    pauses::pause(&console.pool, aggregate_type, event_type, reason).await?;
    Ok(Redirect::to(&page.link("/control")).into_response())
}

pub(super) async fn resume(
    page: Page,
    State(console): State<super::State>,
    Action(form): Action<TypeForm>,
) -> Result<Response, Problem> {
    let (aggregate_type, event_type) = form.named()?;
    pauses::resume(&console.pool, aggregate_type, event_type).await?;
    Ok(Redirect::to(&page.link("/control")).into_response())
}

pub(super) async fn confirm_replay(
    page: Page,
    State(console): State<super::State>,
    Query(query): Query<ReplayQuery>,
) -> Result<Markup, Problem> {
    let selection = query.select(Utc::now())?;
    let (aggregate_type, event_type) = (&selection.aggregate_type, &selection.event_type);
    let (since, until) = (selection.since, selection.until);
    let matching = replay::count(&console.pool, aggregate_type, event_type, since, until).await?;
    let body = html! {
        @if matching == 0 {
            p { "No event of " (views::event_type(aggregate_type, event_type)) " published between " (instant(&since)) " and " (instant(&until)) " is kept: nothing to replay." }
        } @else {
            p #confirm {
                "This will make " strong { (count(matching)) " published event" @if matching != 1 { "s" } } " of "
                (views::event_type(aggregate_type, event_type)) ", published between " (instant(&since)) " and "
                (instant(&until)) ", pending again: relays deliver them again."
            }
            form #act method="post" action=(page.link("/control/replay")) {
                (csrf(&page))
                input type="hidden" name="aggregate_type" value=(aggregate_type);
                input type="hidden" name="event_type" value=(event_type);
                input type="hidden" name="since" value=(since.to_rfc3339());
                input type="hidden" name="until" value=(until.to_rfc3339());
                button type="submit" { "Yes, replay " (count(matching)) }
                " " a href=(page.link("/control")) { "Cancel" }
            }
        }
    };
    Ok(layout(&page, Section::Control, "Replay?", body))
}

pub(super) async fn replay(
    page: Page,
    State(console): State<super::State>,
    Action(query): Action<ReplayQuery>,
) -> Result<Markup, Problem> {
    let s = query.select(Utc::now())?;
    let replayed =
        replay::replay(&console.pool, &s.aggregate_type, &s.event_type, s.since, s.until).await?;
    Ok(done(&page, Section::Control, &format!("Replayed {} events", count(replayed)), "/control"))
}
