//! The floor under `emit`: the same row written by one plain INSERT into a table with the
//! outbox's columns and only a primary key (no partial indexes, no trigger, no identity).

use std::time::{Duration, Instant};

use outbox_runtime::OutboxEvent;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::cpu::Cpu;
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
    insert_into(conn, "bare_events", event).await;
}

/// [`insert`]'s statement into `table`.
async fn insert_into(conn: &mut PgConnection, table: &str, event: &Credited) {
    sqlx::query(&format!(
        "INSERT INTO {table} (event_id, aggregate_type, aggregate_id, event_type, payload, \
                              headers) \
         VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb)"
    ))
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

/// How a producer writes its one event per transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// `outbox_runtime::emit`.
    Emit,
    /// The bare INSERT's statement, into `outbox.events`: what a SQL producer pays, the
    /// outbox's indexes, defaults and trigger included, with no Rust-side work.
    SqlInsert,
    /// [`insert`] into `bare_events`: the floor.
    Bare,
}

impl Writer {
    pub const ALL: [Writer; 3] = [Writer::Emit, Writer::SqlInsert, Writer::Bare];

    async fn write(self, tx: &mut Transaction<'_, Postgres>, event: &Credited) {
        match self {
            Writer::Emit => {
                outbox_runtime::emit(tx, event).await.unwrap();
            }
            Writer::SqlInsert => insert_into(tx, "outbox.events", event).await,
            Writer::Bare => insert(tx, event).await,
        }
    }
}

/// `producers` tasks each commit one event per transaction, written by `writer`, nothing else,
/// for `duration`; returns events per second.
pub async fn inserts(pool: &PgPool, producers: usize, duration: Duration, writer: Writer) -> f64 {
    inserts_costed(pool, producers, duration, writer).await.rate
}

/// What one writer's turn achieved.
struct Turn {
    /// Transactions (one event each) per second.
    rate: f64,
    /// CPU this process spent per transaction, in microseconds: the client's side.
    client_micros: f64,
}

/// [`inserts`], with the bench process's own CPU per transaction.
async fn inserts_costed(
    pool: &PgPool,
    producers: usize,
    duration: Duration,
    writer: Writer,
) -> Turn {
    let cpu = Cpu::now();
    let rate = emit::per_second(producers, duration, |p, until| {
        let pool = pool.clone();
        async move {
            let mut done = 0;
            while Instant::now() < until {
                let mut tx = pool.begin().await.unwrap();
                writer.write(&mut tx, &Credited { account: p as u32, cents: 1 }).await;
                tx.commit().await.unwrap();
                done += 1;
            }
            done
        }
    })
    .await;
    let transactions = rate * duration.as_secs_f64();
    Turn { rate, client_micros: cpu.since().own_secs * 1e6 / transactions.max(1.0) }
}

/// Each writer's events per second and the bench's own CPU per event (microseconds), one event
/// per transaction: `rounds` turns of `duration` each, the order rotated by `first` and each
/// round, so drift (the tables growing, the machine's other load) falls on all three. In
/// [`Writer::ALL`]'s order.
pub async fn floor(
    pool: &PgPool,
    producers: usize,
    duration: Duration,
    rounds: usize,
    first: usize,
) -> ([f64; 3], [f64; 3]) {
    let (mut rates, mut client_micros) = ([0.0; 3], [0.0; 3]);
    for round in 0..rounds {
        for turn in 0..3 {
            let w = (first + round + turn) % 3;
            let turn = inserts_costed(pool, producers, duration, Writer::ALL[w]).await;
            rates[w] += turn.rate / rounds as f64;
            client_micros[w] += turn.client_micros / rounds as f64;
        }
    }
    (rates, client_micros)
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
