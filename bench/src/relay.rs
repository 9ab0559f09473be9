//! Our relay: draining a backlog, and steady state with producers running.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_runtime::{EventContext, Relay};
use sqlx::PgPool;
use tokio::sync::broadcast;

use crate::events::{Credited, Posted};

async fn noop<E>(_: EventContext, _: E) -> Result<(), std::convert::Infallible> {
    Ok(())
}

/// How to run the relays of one drain.
#[derive(Clone, Copy)]
pub struct Setup {
    pub relays: usize,
    pub concurrency: usize,
    pub ordered: bool,
}

/// Runs relays until `events` events are delivered; returns events per second.
pub async fn drain(pool: &PgPool, events: usize, setup: Setup) -> f64 {
    let (stop, _) = broadcast::channel::<()>(1);
    let mut running = Vec::new();
    let mut metrics = Vec::new();
    let started = Instant::now();
    for _ in 0..setup.relays {
        let builder = Relay::builder(pool.clone()).concurrency(setup.concurrency);
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
    rate
}

/// Steady state: `producers` tasks each commit one event per transaction for `duration`
/// while one relay delivers. Returns (delivered events/s, latencies from commit to handler).
pub async fn steady(pool: &PgPool, producers: usize, duration: Duration) -> (f64, Vec<Duration>) {
    #[derive(Clone, Default)]
    struct Clock(Arc<Mutex<Vec<Duration>>>);
    async fn timed(ctx: EventContext<(Clock, Instant)>, e: Credited) -> Result<(), std::io::Error> {
        // `cents` carries the commit time in microseconds since the bench's epoch.
        let (clock, epoch) = ctx.state();
        let committed = Duration::from_micros(e.cents as u64);
        clock.0.lock().unwrap().push(epoch.elapsed().saturating_sub(committed));
        Ok(())
    }
    let clock = Clock::default();
    let epoch = Instant::now();
    let relay =
        Relay::builder(pool.clone()).state((clock.clone(), epoch)).handler(timed).build().unwrap();
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
                let mut sent = 0_u64;
                while Instant::now() < until {
                    // The commit time is only known after the commit: the event carries the
                    // time just before it, and latency is measured from there (a slight
                    // overestimate, by the commit's own duration).
                    let mut tx = pool.begin().await.unwrap();
                    let at = epoch.elapsed().as_micros() as i64;
                    let event = Credited { account: p as u32, cents: at };
                    outbox_runtime::emit(&mut tx, &event).await.unwrap();
                    tx.commit().await.unwrap();
                    sent += 1;
                }
                sent
            })
        })
        .collect();
    let mut sent = 0;
    for producer in producers {
        sent += producer.await.unwrap();
    }
    while metrics.counts().delivered < sent {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let _ = stop.send(());
    running.await.unwrap().unwrap();
    let latencies = std::mem::take(&mut *clock.0.lock().unwrap());
    (sent as f64 / duration.as_secs_f64(), latencies)
}
