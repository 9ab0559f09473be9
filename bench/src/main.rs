//! Relay benchmarks against the local PostgreSQL, each workload in a fresh database.
//!
//! `cargo run --release -p outbox-bench -- [--events N] [--runs R]` prints a Markdown table of
//! medians over R runs; ratios compare workloads measured in the same run.

use std::time::{Duration, Instant};

use outbox_runtime::{EventContext, OutboxEvent, Relay};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "account", event_type = "account.credited")]
struct Credited {
    #[outbox(id)]
    account: u32,
    cents: i64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "ledger", event_type = "ledger.posted", ordered)]
struct Posted {
    #[outbox(id)]
    account: u32,
    cents: i64,
}

async fn noop<E>(_: EventContext, _: E) -> Result<(), std::convert::Infallible> {
    Ok(())
}

struct Args {
    events: usize,
    runs: usize,
    url: String,
}

fn args() -> Args {
    let mut args = Args {
        events: 20_000,
        runs: 3,
        url: std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().and_then(|v| v.parse().ok()).expect("a number after the flag");
        match flag.as_str() {
            "--events" => args.events = value(),
            "--runs" => args.runs = value(),
            other => panic!("unknown flag {other}; expected --events N, --runs R"),
        }
    }
    args
}

/// A fresh, migrated database; dropped by `drop_database`.
async fn fresh_database(url: &str, name: &str) -> PgPool {
    let mut admin = PgConnection::connect(url).await.expect("connect to DATABASE_URL");
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut admin).await.unwrap();
    let base = url.rsplit_once('/').map_or(url, |(base, _)| base);
    let pool =
        PgPoolOptions::new().max_connections(8).connect(&format!("{base}/{name}")).await.unwrap();
    outbox_runtime::migrate(&pool).await.unwrap();
    pool
}

async fn drop_database(url: &str, name: &str, pool: PgPool) {
    pool.close().await;
    let mut admin = PgConnection::connect(url).await.unwrap();
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .unwrap();
}

/// Commits `events` events in batches of 1,000.
async fn backlog<E: OutboxEvent>(pool: &PgPool, events: usize, make: impl Fn(usize) -> E) {
    for start in (0..events).step_by(1_000) {
        let batch: Vec<E> = (start..events.min(start + 1_000)).map(&make).collect();
        let mut tx = pool.begin().await.unwrap();
        outbox_runtime::emit_all(&mut tx, &batch).await.unwrap();
        tx.commit().await.unwrap();
    }
    sqlx::query("VACUUM ANALYZE outbox.events").execute(pool).await.unwrap();
}

/// Runs relays built by `relay` until every event is published; returns events per second.
async fn drain(
    pool: &PgPool,
    events: usize,
    relays: usize,
    concurrency: usize,
    ordered: bool,
) -> f64 {
    let mut running = Vec::new();
    let mut metrics = Vec::new();
    let (stop, _) = tokio::sync::broadcast::channel::<()>(1);
    let started = Instant::now();
    for _ in 0..relays {
        let builder = Relay::builder(pool.clone()).concurrency(concurrency);
        let relay = if ordered {
            builder.handler(noop::<Posted>)
        } else {
            builder.handler(noop::<Credited>)
        }
        .build()
        .unwrap();
        metrics.push(relay.metrics());
        let mut stopped = stop.subscribe();
        running.push(tokio::spawn(relay.run_until(async move {
            let _ = stopped.recv().await;
        })));
    }
    loop {
        let delivered: u64 = metrics.iter().map(|m| m.counts().delivered).sum();
        if delivered >= events as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    let _ = stop.send(());
    for relay in running {
        relay.await.unwrap().unwrap();
    }
    events as f64 / elapsed.as_secs_f64()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

struct Workload {
    name: &'static str,
    relays: usize,
    concurrency: usize,
    ordered: bool,
}

#[tokio::main]
async fn main() {
    let args = args();
    let workloads = [
        Workload {
            name: "drain, unordered, 1 relay, concurrency 16",
            relays: 1,
            concurrency: 16,
            ordered: false,
        },
        Workload {
            name: "drain, ordered (1,000 aggregates), 1 relay, concurrency 16",
            relays: 1,
            concurrency: 16,
            ordered: true,
        },
        Workload {
            name: "drain, unordered, 2 relays, concurrency 16",
            relays: 2,
            concurrency: 16,
            ordered: false,
        },
        Workload {
            name: "drain, ordered (1,000 aggregates), 2 relays, concurrency 16",
            relays: 2,
            concurrency: 16,
            ordered: true,
        },
    ];
    let mut results = Vec::new();
    for workload in &workloads {
        let mut rates = Vec::new();
        for run in 0..args.runs {
            let name = format!("outbox_bench_{}", std::process::id());
            let pool = fresh_database(&args.url, &name).await;
            if workload.ordered {
                backlog(&pool, args.events, |i| Posted {
                    account: (i % 1_000) as u32,
                    cents: i as i64,
                })
                .await;
            } else {
                backlog(&pool, args.events, |i| Credited {
                    account: (i % 1_000) as u32,
                    cents: i as i64,
                })
                .await;
            }
            let rate =
                drain(&pool, args.events, workload.relays, workload.concurrency, workload.ordered)
                    .await;
            eprintln!("{} run {}: {rate:.0} events/s", workload.name, run + 1);
            rates.push(rate);
            drop_database(&args.url, &name, pool).await;
        }
        results.push(median(rates));
    }

    println!(
        "| workload | events | events/s (median of {}) | vs unordered, same relays |",
        args.runs
    );
    println!("|---|---:|---:|---:|");
    for (i, (workload, rate)) in workloads.iter().zip(&results).enumerate() {
        let baseline = if workload.ordered { results[i - 1] } else { *rate };
        println!("| {} | {} | {:.0} | {:.2}x |", workload.name, args.events, rate, rate / baseline);
    }
}
