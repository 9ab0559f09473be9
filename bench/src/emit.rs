//! What `emit` costs a producer.

use std::future::Future;
use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::bare;
use crate::events::{credited, Credited};

pub async fn accounts(pool: &PgPool) {
    sqlx::query("CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO accounts SELECT i, 0 FROM generate_series(0, 999) AS i")
        .execute(pool)
        .await
        .unwrap();
}

/// What a business transaction does after its UPDATE.
#[derive(Clone, Copy)]
pub enum Extra {
    Nothing,
    /// The cheapest statement there is: the floor of any second statement's cost.
    SelectOne,
    Emit,
    /// The same row as the emit's, by one plain INSERT into a table with only a primary key.
    Bare,
}

/// `producers` tasks commit transactions of one UPDATE plus `extra` for `duration`; returns
/// transactions per second.
pub async fn business(pool: &PgPool, producers: usize, duration: Duration, extra: Extra) -> f64 {
    per_second(producers, duration, |p, until| {
        let pool = pool.clone();
        async move {
            let mut done = 0;
            let mut account = p as i32 * 97;
            while Instant::now() < until {
                account = (account + 7) % 1_000;
                let mut tx = pool.begin().await.unwrap();
                sqlx::query("UPDATE accounts SET balance = balance + 1 WHERE id = $1")
                    .bind(account)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                match extra {
                    Extra::Nothing => {}
                    Extra::SelectOne => {
                        sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
                    }
                    Extra::Emit => {
                        let event = Credited { account: account as u32, cents: 1 };
                        outbox_runtime::emit(&mut tx, &event).await.unwrap();
                    }
                    Extra::Bare => {
                        let event = Credited { account: account as u32, cents: 1 };
                        bare::insert(&mut tx, &event).await;
                    }
                }
                tx.commit().await.unwrap();
                done += 1;
            }
            done
        }
    })
    .await
}

/// `producers` tasks commit `emit_all` batches of 100 events for `duration`; returns events
/// per second.
pub async fn batches<DB: outbox_runtime::Backend>(
    pool: &sqlx::Pool<DB>,
    producers: usize,
    duration: Duration,
) -> f64 {
    per_second(producers, duration, |_, until| {
        let pool = pool.clone();
        async move {
            let batch: Vec<Credited> = (0..100).map(credited).collect();
            let mut done = 0;
            while Instant::now() < until {
                let mut tx = pool.begin().await.unwrap();
                outbox_runtime::emit_all(&mut tx, &batch).await.unwrap();
                tx.commit().await.unwrap();
                done += 100;
            }
            done
        }
    })
    .await
}

/// Runs `producer(p, until)` as a task for each of `producers`, each working until `until`,
/// `duration` from now; returns the sum of what they counted, per second.
pub async fn per_second<F, Fut>(producers: usize, duration: Duration, producer: F) -> f64
where
    F: Fn(usize, Instant) -> Fut,
    Fut: Future<Output = u64> + Send + 'static,
{
    let until = Instant::now() + duration;
    let tasks: Vec<_> = (0..producers).map(|p| tokio::spawn(producer(p, until))).collect();
    let mut done = 0;
    for task in tasks {
        done += task.await.unwrap();
    }
    done as f64 / duration.as_secs_f64()
}
