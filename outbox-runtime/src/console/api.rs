//! The JSON API: the pages' readings and actions for scripts, behind `Authorization: Bearer`.
//! The shapes are those of `outbox ... --json` (see the module docs).

use axum::extract::{Path, Query, State};
use axum::Json;
use chrono::Utc;
use serde::Deserialize;
use serde_json::{json, Value};

use super::actions::DeadAction;
use super::filters::{
    event_id, given, AggregateQuery, DeadLetters, DeadPage, DeadQuery, ReplayQuery, TypeForm,
    AGGREGATE_PAGE_SIZE,
};
use super::overview;
use super::problem::{ApiProblem, Problem};
use crate::{events, pauses, relays, replay};

type Answer = Result<Json<Value>, ApiProblem>;

pub(super) async fn overview(State(console): State<super::State>) -> Answer {
    Ok(Json(json!(overview::read(&console.pool, Utc::now()).await?)))
}

pub(super) async fn relays(State(console): State<super::State>) -> Answer {
    Ok(Json(json!(relays::relays(&console.pool).await?)))
}

pub(super) async fn event(State(console): State<super::State>, Path(id): Path<String>) -> Answer {
    let id = event_id(&id)?;
    match events::get(&console.pool, id).await? {
        Some(event) => Ok(Json(json!(event))),
        None => Err(Problem::NotFound(format!("no event {id} in the outbox")).into()),
    }
}

pub(super) async fn aggregate(
    State(console): State<super::State>,
    Query(query): Query<AggregateQuery>,
) -> Answer {
    let (pool, aggregate_type, aggregate_id) =
        (&console.pool, &query.aggregate_type, &query.aggregate_id);
    let found = events::of_aggregate(pool, aggregate_type, aggregate_id, AGGREGATE_PAGE_SIZE);
    Ok(Json(json!(found.await?)))
}

/// `next`: the next page's query string (the selection's ages pinned to instants, so it
/// continues the same list), `next_after`: the id it starts after.
pub(super) async fn dead(
    State(console): State<super::State>,
    Query(dead_page): Query<DeadPage>,
) -> Answer {
    let DeadLetters { matching, events, next } = dead_page.read(&console.pool, Utc::now()).await?;
    let (next, next_after) = match next {
        Some((pinned, after)) => {
            (Some(format!("{}&after={after}", pinned.query_string())), Some(after))
        }
        None => (None, None),
    };
    Ok(Json(json!({ "count": matching, "events": events, "next": next, "next_after": next_after })))
}

pub(super) async fn act_on_dead(
    State(console): State<super::State>,
    Path(action): Path<DeadAction>,
    Json(query): Json<DeadQuery>,
) -> Answer {
    let done_to = action.apply(&console.pool, &query).await?;
    Ok(Json(json!({ action.done(): done_to })))
}

pub(super) async fn pause(
    State(console): State<super::State>,
    Json(body): Json<TypeForm>,
) -> Answer {
    let (aggregate_type, event_type) = body.named()?;
    let reason = given(&body.reason);
    let paused = pauses::pause(&console.pool, aggregate_type, event_type, reason).await?;
    Ok(Json(json!({ "paused": paused })))
}

pub(super) async fn resume(
    State(console): State<super::State>,
    Json(body): Json<TypeForm>,
) -> Answer {
    let (aggregate_type, event_type) = body.named()?;
    let resumed = pauses::resume(&console.pool, aggregate_type, event_type).await?;
    Ok(Json(json!({ "resumed": resumed })))
}

#[derive(Deserialize)]
pub(super) struct ReplayBody {
    #[serde(flatten)]
    query: ReplayQuery,
    #[serde(default)]
    dry_run: bool,
}

pub(super) async fn replay(
    State(console): State<super::State>,
    Json(body): Json<ReplayBody>,
) -> Answer {
    let s = body.query.select(Utc::now())?;
    let (pool, aggregate_type, event_type) = (&console.pool, &s.aggregate_type, &s.event_type);
    if body.dry_run {
        let count = replay::count(pool, aggregate_type, event_type, s.since, s.until).await?;
        return Ok(Json(json!({ "would_replay": count })));
    }
    let replayed = replay::replay(pool, aggregate_type, event_type, s.since, s.until).await?;
    Ok(Json(json!({ "replayed": replayed })))
}
