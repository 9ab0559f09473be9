//! The floor under `emit`: the same row written by one plain INSERT into a table with the
//! outbox's columns and only a primary key (no partial indexes, no trigger, no identity).

use std::time::{Duration, Instant};

use outbox_runtime::OutboxEvent;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::emit::{self, Extra};
use crate::events::Credited;

/// Creates `bare_events`: the reference design's columns, a primary key and nothing else.
pub async fn schema(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE bare_events ( \
             event_id uuid PRIMARY KEY, aggregate_type text NOT NULL, \
             aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL, \
             headers jsonb NOT NULL DEFAULT '{}', created_at timestamptz NOT NULL DEFAULT now(), \
             available_at timestamptz NOT NULL DEFAULT now(), \
             attempts integer NOT NULL DEFAULT 0, last_error text, published_at timestamptz)",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// Inserts the row `emit` would write for `event`: a version 7 id made here, the payload
/// serialized by serde_json, the same headers; bound as `emit` binds them.
pub async fn insert(conn: &mut PgConnection, event: &Credited) {
    sqlx::query(
        "INSERT INTO bare_events (event_id, aggregate_type, aggregate_id, event_type, payload, \
                                  headers) \
         VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb)",
    )
    .bind(Uuid::now_v7())
    .bind(Credited::AGGREGATE_TYPE)
    .bind(event.account.to_string())
    .bind(Credited::EVENT_TYPE)
    .bind(serde_json::to_string(event).unwrap())
    .bind("{}")
    .execute(conn)
    .await
    .unwrap();
}

/// `producers` tasks each commit one bare INSERT per transaction, nothing else, for
/// `duration`; returns rows per second.
pub async fn inserts(pool: &PgPool, producers: usize, duration: Duration) -> f64 {
    emit::per_second(producers, duration, |p, until| {
        let pool = pool.clone();
        async move {
            let mut done = 0;
            while Instant::now() < until {
                let mut tx = pool.begin().await.unwrap();
                insert(&mut tx, &Credited { account: p as u32, cents: 1 }).await;
                tx.commit().await.unwrap();
                done += 1;
            }
            done
        }
    })
    .await
}

/// The business transaction (emit.rs) with one emit, and with one bare INSERT instead, in
/// `rounds` turns each of `duration`, alternating so drift (the tables growing, the machine's
/// other load) falls on both sides; `bare_first` says who starts. Returns (emit tx/s, bare tx/s).
pub async fn against_emit(
    pool: &PgPool,
    producers: usize,
    duration: Duration,
    rounds: usize,
    bare_first: bool,
) -> (f64, f64) {
    let (mut with_emit, mut with_bare) = (0.0, 0.0);
    for round in 0..rounds * 2 {
        if (round % 2 == 0) == bare_first {
            with_bare += emit::business(pool, producers, duration, Extra::Bare).await;
        } else {
            with_emit += emit::business(pool, producers, duration, Extra::Emit).await;
        }
    }
    (with_emit / rounds as f64, with_bare / rounds as f64)
}
