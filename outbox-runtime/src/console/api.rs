//! The JSON API: the pages' readings and actions for scripts, behind `Authorization: Bearer`.
//! The shapes are those of `outbox ... --json` (see the module docs).

use axum::extract::{Path, Query, State};
use axum::Json;
use chrono::Utc;
use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::filters::{given, DeadQuery, ReplayQuery};
use super::overview;
use super::problem::{ApiProblem, Problem};
use crate::{dead_letters, events, pauses, relays, replay};

type Answer = Result<Json<Value>, ApiProblem>;

/// Dead letters per call.
const PAGE_SIZE: u32 = 50;

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

#[derive(Deserialize)]
pub(super) struct AggregateQuery {
    aggregate_type: String,
    aggregate_id: String,
}

pub(super) async fn aggregate(
    State(console): State<super::State>,
    Query(query): Query<AggregateQuery>,
) -> Answer {
    let (pool, aggregate_type, aggregate_id) =
        (&console.pool, &query.aggregate_type, &query.aggregate_id);
    Ok(Json(json!(events::of_aggregate(pool, aggregate_type, aggregate_id, 200).await?)))
}

#[derive(Deserialize)]
pub(super) struct DeadPage {
    #[serde(flatten)]
    query: DeadQuery,
    after: Option<String>,
}

pub(super) async fn dead(
    State(console): State<super::State>,
    Query(DeadPage { query, after }): Query<DeadPage>,
) -> Answer {
    let filter = query.select(Utc::now())?.filter;
    let after = given(&after).map(event_id).transpose()?;
    let (matching, events) = tokio::try_join!(
        dead_letters::count(&console.pool, &filter),
        dead_letters::list(&console.pool, &filter, after, PAGE_SIZE),
    )?;
    let next_after =
        (events.len() == PAGE_SIZE as usize).then(|| events.last().map(|e| e.event_id));
    Ok(Json(json!({ "count": matching, "events": events, "next_after": next_after.flatten() })))
}

pub(super) async fn requeue_dead(
    State(console): State<super::State>,
    Json(query): Json<DeadQuery>,
) -> Answer {
    let filter = query.select(Utc::now())?.filter;
    Ok(Json(json!({ "requeued": dead_letters::requeue(&console.pool, &filter).await? })))
}

pub(super) async fn discard_dead(
    State(console): State<super::State>,
    Json(query): Json<DeadQuery>,
) -> Answer {
    let filter = query.select(Utc::now())?.filter;
    Ok(Json(json!({ "discarded": dead_letters::discard(&console.pool, &filter).await? })))
}

#[derive(Deserialize)]
pub(super) struct TypeBody {
    aggregate_type: String,
    event_type: String,
    #[serde(default)]
    reason: Option<String>,
}

pub(super) async fn pause(
    State(console): State<super::State>,
    Json(body): Json<TypeBody>,
) -> Answer {
    let reason = given(&body.reason);
    let paused =
        pauses::pause(&console.pool, &body.aggregate_type, &body.event_type, reason).await?;
    Ok(Json(json!({ "paused": paused })))
}

pub(super) async fn resume(
    State(console): State<super::State>,
    Json(body): Json<TypeBody>,
) -> Answer {
    let resumed = pauses::resume(&console.pool, &body.aggregate_type, &body.event_type).await?;
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

fn event_id(id: &str) -> Result<Uuid, Problem> {
    Uuid::parse_str(id)
        .map_err(|error| Problem::BadInput(format!("`{id}` is not an event id ({error})")))
}
