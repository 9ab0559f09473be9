//! Our relay: draining a backlog, and steady state with producers running.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_runtime::{EventContext, Relay};
use sqlx::PgPool;
use tokio::sync::broadcast;
use uuid::Uuid;

use crate::events::{Credited, Posted};

/// Handler calls, shared by every relay of a drain.
type Calls = Arc<AtomicU64>;

/// Does nothing but count its calls.
async fn noop<E>(ctx: EventContext<Calls>, _: E) -> Result<(), std::convert::Infallible> {
    ctx.state().fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// What one drain measured.
pub struct Drained {
    pub events_per_second: f64,
    /// Handler calls beyond one per event.
    pub duplicates: u64,
}

/// How to run the relays of one drain.
#[derive(Clone, Copy)]
pub struct Setup {
    pub relays: usize,
    pub concurrency: usize,
    pub batch_size: u32,
    pub ordered: bool,
}

/// Runs relays until `events` events are delivered.
pub async fn drain(pool: &PgPool, events: usize, setup: Setup) -> Drained {
    let calls = Calls::default();
    let (stop, _) = broadcast::channel::<()>(1);
    let mut running = Vec::new();
    let mut metrics = Vec::new();
    let started = Instant::now();
    for _ in 0..setup.relays {
        let builder = Relay::builder(pool.clone())
            .state(calls.clone())
            .concurrency(setup.concurrency)
            .batch_size(setup.batch_size);
        let builder = if setup.ordered {
            builder.handler(noop::<Posted>)
        } else {
            builder.handler(noop::<Credited>)
        };
        let relay = builder.build().unwrap();
        metrics.push(relay.metrics());
        let mut stopped = stop.subscribe();
        running.push(tokio::spawn(relay.run_until(async move {
            let _ = stopped.recv().await;
        })));
    }
    while metrics.iter().map(|m| m.counts().delivered).sum::<u64>() < events as u64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let rate = events as f64 / started.elapsed().as_secs_f64();
    let _ = stop.send(());
    for relay in running {
        relay.await.unwrap().unwrap();
    }
    Drained { events_per_second: rate, duplicates: calls.load(Ordering::Relaxed) - events as u64 }
}

/// Steady state: `producers` tasks each commit one event per transaction for `duration`
/// while one relay delivers. Returns (delivered events/s, latencies from the end of each
/// emitting commit, as the producer saw it, to the handler call).
pub async fn steady(pool: &PgPool, producers: usize, duration: Duration) -> (f64, Vec<Duration>) {
    type Times = Arc<Mutex<HashMap<Uuid, Instant>>>;
    async fn timed(ctx: EventContext<Times>, _: Credited) -> Result<(), std::io::Error> {
        ctx.state().lock().unwrap().insert(ctx.event_id(), Instant::now());
        Ok(())
    }
    let handled: Times = Arc::default();
    let relay = Relay::builder(pool.clone()).state(handled.clone()).handler(timed).build().unwrap();
    let metrics = relay.metrics();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let until = Instant::now() + duration;
    let producers: Vec<_> = (0..producers)
        .map(|p| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut committed = Vec::new();
                while Instant::now() < until {
                    let mut tx = pool.begin().await.unwrap();
                    let event = Credited { account: p as u32, cents: 1 };
                    let id = outbox_runtime::emit(&mut tx, &event).await.unwrap();
                    tx.commit().await.unwrap();
                    committed.push((id, Instant::now()));
                }
                committed
            })
        })
        .collect();
    let mut committed = Vec::new();
    for producer in producers {
        committed.extend(producer.await.unwrap());
    }
    while metrics.counts().delivered < committed.len() as u64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let _ = stop.send(());
    running.await.unwrap().unwrap();
    let handled = handled.lock().unwrap();
    // The relay can see a commit before the producer's COMMIT returns: that counts as zero.
    let latencies =
        committed.iter().map(|(id, at)| handled[id].saturating_duration_since(*at)).collect();
    (committed.len() as f64 / duration.as_secs_f64(), latencies)
}
