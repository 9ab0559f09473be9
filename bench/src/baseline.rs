//! Baselines, measured in the same run as the relay: the reference design's SQL as written,
//! and a hand-tuned plain-SQL relay on the outbox table.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sqlx::{PgPool, Row};
use uuid::Uuid;

use outbox_runtime::OutboxEvent;

use crate::events::Credited;

/// The reference design's table, with a partial index on pending rows (its module ships no
/// DDL; this is the index its lease query needs).
pub async fn reference_schema(pool: &PgPool, events: usize) {
    sqlx::query(
        "CREATE TABLE public.athena_outbox ( \
             event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), \
             aggregate_type text NOT NULL, aggregate_id text NOT NULL, event_type text NOT NULL, \
             payload jsonb NOT NULL, headers jsonb NOT NULL DEFAULT '{}', \
             created_at timestamptz NOT NULL DEFAULT now(), \
             available_at timestamptz NOT NULL DEFAULT now(), \
             attempts integer NOT NULL DEFAULT 0, last_error text, published_at timestamptz)",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "CREATE INDEX athena_outbox_pending ON public.athena_outbox (available_at) \
         WHERE published_at IS NULL",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO public.athena_outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'account', (i % 1000)::text, 'account.credited', \
                jsonb_build_object('account', i % 1000, 'cents', i) \
         FROM generate_series(1, $1) AS i",
    )
    .bind(events as i64)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE public.athena_outbox").execute(pool).await.unwrap();
}

/// The reference relay: `workers` loops, each leasing 100 rows with the reference's lease
/// statement verbatim and marking each published with its own statement. Returns (events/s,
/// deliveries beyond one per event).
pub async fn reference(pool: &PgPool, events: usize, workers: usize) -> (f64, usize) {
    let deliveries: Arc<Mutex<HashMap<Uuid, usize>>> = Arc::default();
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (pool, deliveries) = (pool.clone(), deliveries.clone());
            tokio::spawn(async move {
                loop {
                    let rows = sqlx::query(
                        r#"
        UPDATE public.athena_outbox
        SET    attempts = attempts + 1
        WHERE  event_id IN (
            SELECT event_id
            FROM   public.athena_outbox
            WHERE  published_at IS NULL
              AND  available_at  <= now()
              AND  attempts      <  $2
            ORDER BY available_at
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        )
        RETURNING
            event_id,
            aggregate_type,
            aggregate_id,
            event_type,
            payload,
            headers,
            created_at,
            available_at,
            attempts,
            last_error,
            published_at
        "#,
                    )
                    .bind(100_i32)
                    .bind(i32::MAX)
                    .fetch_all(&pool)
                    .await
                    .unwrap();
                    if rows.is_empty() {
                        return;
                    }
                    for row in rows {
                        let event_id: Uuid = row.get("event_id");
                        let payload: serde_json::Value = row.get("payload");
                        let _: Credited = serde_json::from_value(payload).unwrap();
                        *deliveries.lock().unwrap().entry(event_id).or_default() += 1;
                        sqlx::query(
                            r#"
        UPDATE public.athena_outbox
        SET published_at = now()
        WHERE event_id = $1
          AND published_at IS NULL
        "#,
                        )
                        .bind(event_id)
                        .execute(&pool)
                        .await
                        .unwrap();
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let rate = events as f64 / started.elapsed().as_secs_f64();
    let total: usize = deliveries.lock().unwrap().values().sum();
    (rate, total - events)
}

/// A hand-tuned plain-SQL relay on `outbox.events`: lease the oldest 100 rows of its one event
/// type (through the per-type pending index) pushing `available_at` under a token, decode and handle each, acknowledge the batch in one statement. One loop.
pub async fn hand_tuned(pool: &PgPool, events: usize) -> f64 {
    // One connection for the whole loop: no pool round trips between statements.
    let mut conn = pool.acquire().await.unwrap();
    let started = Instant::now();
    let mut delivered = 0;
    while delivered < events {
        let token = Uuid::new_v4();
        let rows = sqlx::query(
            "UPDATE outbox.events e SET lease_token = $1, \
                    available_at = now() + interval '30 seconds' \
             FROM (SELECT event_id FROM outbox.events \
                   WHERE aggregate_type = $2 AND event_type = $3 \
                     AND published_at IS NULL AND dead_at IS NULL AND available_at <= now() \
                   ORDER BY available_at, seq LIMIT 100 FOR UPDATE SKIP LOCKED) c \
             WHERE e.event_id = c.event_id \
             RETURNING e.event_id, e.payload::text",
        )
        .bind(token)
        .bind(Credited::AGGREGATE_TYPE)
        .bind(Credited::EVENT_TYPE)
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            let _: Credited = serde_json::from_str(row.get(1)).unwrap();
            ids.push(row.get::<Uuid, _>(0));
        }
        sqlx::query(
            "UPDATE outbox.events SET published_at = now() \
             WHERE event_id = ANY($1) AND lease_token = $2",
        )
        .bind(&ids)
        .bind(token)
        .execute(&mut *conn)
        .await
        .unwrap();
        delivered += ids.len();
    }
    events as f64 / started.elapsed().as_secs_f64()
}
