//! `relay-process`: a relay in a process of its own, for the crash and soak tests
//! (`tests/faults_crash.rs`), which SIGKILL it, run several at once and read its memory use.
//!
//! It delivers `job.run` events to a plain (not transactional) handler that records each
//! delivery as a row `(event_id, attempt, pid, ok)` in the table `deliveries`, which the test
//! creates. The record commits apart from the acknowledgement, so a kill between the two leaves a
//! legitimate duplicate for the test to account for.
//!
//! Runs until SIGTERM or ctrl-c (graceful shutdown; prints its counts to stderr and exits 0) or
//! until it is killed. Settings, all optional except the database URL:
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `DATABASE_URL` (or the first argument) | | where the outbox lives: PostgreSQL, or `sqlite:` or `mysql:` |
//! | `RELAY_CONCURRENCY` | 16 | handlers at once |
//! | `RELAY_BATCH_SIZE` | 50 | rows per lease statement |
//! | `RELAY_LEASE_TIMEOUT_MS` | 1000 | lease timeout |
//! | `RELAY_MAX_ATTEMPTS` | 10 | attempts before a row is dead |
//! | `RELAY_POLL_INTERVAL_MS` | 50 | idle polling |
//! | `RELAY_BACKOFF_BASE_MS`, `RELAY_BACKOFF_CAP_MS` | 10, 50 | retry delays, without jitter |
//! | `RELAY_POOL_CONNECTIONS` | 4 | the handlers' pool (the relay opens 5 more of its own) |
//! | `RELAY_WORKER_THREADS` | 2 | tokio worker threads |
//! | `FAIL_PERCENT` | 0 | share of attempts that fail, decided from a hash of event id and attempt |
//! | `POISON_EVERY` | 0 (off) | jobs whose `n` is a multiple of this fail on every attempt |
//! | `HANDLER_SLEEP_MS` | 0 | how long each delivery takes before it is recorded |
//! | `HANDLER_TRANSACTIONAL` | 0 | 1: a transactional handler records each delivery in the acknowledgement's transaction |
//! | `RELAY_DELETE_ON_PUBLISH` | 0 | 1: delivered rows are deleted by their acknowledgement |
//! | `FORWARD_TO` | unset | forward instead of handling: `nats` (JetStream stream `FORWARD_STREAM` on 127.0.0.1:4222), `rabbitmq` (exchange `FORWARD_EXCHANGE` on 127.0.0.1:5672), `redis` (127.0.0.1:6379) or `kafka` (127.0.0.1:9092, topic `<FORWARD_PREFIX>.job.job.run`, created with 3 partitions), to destinations `<FORWARD_PREFIX>.<aggregate type>.<event type>` |
//! | `RELAY_LOG` | `warn` | what the relay logs to stderr (a `tracing` filter) |

use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use outbox_runtime::forward::kafka::{rdkafka, KafkaSink};
use outbox_runtime::forward::nats::{async_nats, NatsSink};
use outbox_runtime::forward::rabbitmq::{lapin, RabbitSink};
use outbox_runtime::forward::redis::{redis, RedisSink};
use outbox_runtime::forward::Forward;
use outbox_runtime::{Backoff, EventContext, LeaseMode, OutboxEvent, Relay, TransactionContext};
use serde::{Deserialize, Serialize};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::SqlitePoolOptions;
use sqlx::{MySqlPool, PgPool, SqlitePool};
use tokio::signal::unix::{signal, SignalKind};

/// The test event; `tests/faults_crash.rs` declares the same type to emit it.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "job", event_type = "job.run")]
struct JobRun {
    #[outbox(id)]
    job: u64,
    n: u64,
}

/// Where deliveries are recorded: the outbox's database.
#[derive(Clone)]
enum Recorder {
    Postgres(PgPool),
    Sqlite(SqlitePool),
    MySql(MySqlPool),
}

impl Recorder {
    async fn record(
        &self,
        event_id: outbox_runtime::sqlx::types::Uuid,
        attempt: i32,
        pid: i32,
        ok: bool,
    ) -> Result<(), sqlx::Error> {
        const NUMBERED: &str =
            "INSERT INTO deliveries (event_id, attempt, pid, ok) VALUES ($1, $2, $3, $4)";
        const PLAIN: &str =
            "INSERT INTO deliveries (event_id, attempt, pid, ok) VALUES (?, ?, ?, ?)";
        macro_rules! record {
            ($sql:expr, $pool:expr) => {
                sqlx::query($sql)
                    .bind(event_id)
                    .bind(attempt)
                    .bind(pid)
                    .bind(ok)
                    .execute($pool)
                    .await
                    .map(|_| ())?
            };
        }
        match self {
            Recorder::Postgres(pool) => record!(NUMBERED, pool),
            Recorder::Sqlite(pool) => record!(PLAIN, pool),
            Recorder::MySql(pool) => record!(PLAIN, pool),
        };
        Ok(())
    }
}

#[derive(Clone)]
struct Worker {
    recorder: Recorder,
    pid: i32,
    fail_percent: u64,
    poison_every: u64,
    sleep: Duration,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct JobFailed(String);

impl Worker {
    /// Whether this attempt fails: always for poisoned jobs, else for `fail_percent` of the
    /// `(event id, attempt)` pairs, the same ones in every process and every run.
    fn fails(&self, ctx: &EventContext<Self>, job: &JobRun) -> bool {
        if self.poison_every > 0 && job.n.is_multiple_of(self.poison_every) {
            return true;
        }
        let id = ctx.event_id().as_u128();
        let seed = (id as u64) ^ ((id >> 64) as u64) ^ (u64::from(delivery(ctx)) << 56);
        splitmix64(seed) % 100 < self.fail_percent
    }
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

async fn run_job(ctx: EventContext<Worker>, job: JobRun) -> Result<(), JobFailed> {
    let worker = ctx.state();
    let fails = worker.fails(&ctx, &job);
    if !worker.sleep.is_zero() {
        tokio::time::sleep(worker.sleep).await;
    }
    // Not in the acknowledgement's transaction: a kill after this commits and before the
    // acknowledgement does is a duplicate delivery, as at-least-once allows.
    let attempt = i32::try_from(delivery(&ctx)).unwrap_or(i32::MAX);
    worker
        .recorder
        .record(ctx.event_id(), attempt, worker.pid, !fails)
        .await
        .map_err(|error| JobFailed(format!("cannot record the delivery: {error}")))?;
    if fails {
        return Err(JobFailed(format!("job {} failed on attempt {}", job.job, delivery(&ctx))));
    }
    Ok(())
}

/// The same job in the acknowledgement's transaction: the record and the acknowledgement commit
/// together, so each event is recorded exactly once.
async fn run_job_in_transaction(
    mut ctx: TransactionContext<Worker>,
    job: JobRun,
) -> Result<(), JobFailed> {
    let worker = ctx.state().clone();
    if !worker.sleep.is_zero() {
        tokio::time::sleep(worker.sleep).await;
    }
    let (event_id, attempt) = (ctx.event_id(), delivery(&ctx));
    sqlx::query("INSERT INTO deliveries (event_id, attempt, pid, ok) VALUES ($1, $2, $3, true)")
        .bind(event_id)
        .bind(i32::try_from(attempt).unwrap_or(i32::MAX))
        .bind(worker.pid)
        .execute(&mut **ctx.tx())
        .await
        .map_err(|error| JobFailed(format!("job {}: cannot record: {error}", job.job)))?;
    Ok(())
}

fn setting<T: FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(value) => value.parse().map_err(|_| format!("{name}={value:?} is not a valid value")),
        Err(_) => Ok(default),
    }
}

fn millis(name: &str, default: u64) -> Result<Duration, String> {
    setting(name, default).map(Duration::from_millis)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("relay-process {}: {error}", std::process::id());
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let filter = std::env::var("RELAY_LOG").unwrap_or_else(|_| "warn".to_owned());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(setting("RELAY_WORKER_THREADS", 2)?)
        .enable_all()
        .build()
        .map_err(|error| format!("cannot start the runtime: {error}"))?;
    runtime.block_on(relay())
}

async fn relay() -> Result<(), String> {
    // Installed first, so a SIGTERM at any time after start-up means a graceful shutdown.
    let mut terminate = signal(SignalKind::terminate())
        .map_err(|error| format!("cannot catch SIGTERM: {error}"))?;
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };

    let url = match std::env::args().nth(1) {
        Some(url) => url,
        None => std::env::var("DATABASE_URL").map_err(|_| "no DATABASE_URL given".to_owned())?,
    };
    let connections = setting("RELAY_POOL_CONNECTIONS", 4)?;
    let cannot_connect = |error| format!("cannot connect: {error}");
    let (recorder, builder) = if url.starts_with("sqlite:") {
        let pool = SqlitePoolOptions::new().max_connections(connections);
        let pool = pool.connect(&url).await.map_err(cannot_connect)?;
        (Recorder::Sqlite(pool.clone()), Relay::builder(pool))
    } else if url.starts_with("mysql:") {
        let pool = MySqlPoolOptions::new().max_connections(connections);
        let pool = pool.connect(&url).await.map_err(cannot_connect)?;
        (Recorder::MySql(pool.clone()), Relay::builder(pool))
    } else {
        let pool = PgPoolOptions::new().max_connections(connections);
        let pool = pool.connect(&url).await.map_err(cannot_connect)?;
        (Recorder::Postgres(pool.clone()), Relay::builder(pool))
    };
    let worker = Worker {
        recorder,
        pid: i32::try_from(std::process::id()).unwrap_or(i32::MAX),
        fail_percent: setting("FAIL_PERCENT", 0)?,
        poison_every: setting("POISON_EVERY", 0)?,
        sleep: millis("HANDLER_SLEEP_MS", 0)?,
    };
    let backoff = Backoff {
        base: millis("RELAY_BACKOFF_BASE_MS", 10)?,
        cap: millis("RELAY_BACKOFF_CAP_MS", 50)?,
        jitter: false,
    };
    let builder = builder.state(worker);
    let builder = if let Ok(broker) = std::env::var("FORWARD_TO") {
        let prefix = std::env::var("FORWARD_PREFIX").unwrap_or_else(|_| "outbox".to_owned());
        let destination = format!("{prefix}.{{aggregate_type}}.{{event_type}}");
        builder.forward(forward_to(&broker, &prefix).await?.destination(&destination))
    } else if setting("HANDLER_TRANSACTIONAL", 0)? == 1 {
        builder.handler(run_job_in_transaction)
    } else {
        builder.handler(run_job)
    };
    let relay = builder
        .concurrency(setting("RELAY_CONCURRENCY", 16)?)
        .batch_size(setting("RELAY_BATCH_SIZE", 50)?)
        .lease_timeout(millis("RELAY_LEASE_TIMEOUT_MS", 1_000)?)
        .max_attempts(setting("RELAY_MAX_ATTEMPTS", 10)?)
        .poll_interval(millis("RELAY_POLL_INTERVAL_MS", 50)?)
        .backoff(backoff)
        .delete_on_publish(setting("RELAY_DELETE_ON_PUBLISH", 0)? == 1)
        .lease_mode(match setting("RELAY_HELD_TRANSACTION", 0)? {
            1 => LeaseMode::HeldTransaction,
            _ => LeaseMode::Written,
        })
        .build()
        .map_err(|error| error.to_string())?;
    let counts = relay.run_until(shutdown).await.map_err(|error| error.to_string())?;
    // One line the tests parse.
    eprintln!(
        "relay-process {} stopped: delivered={} failed={} dead={} handed_back={} lost_leases={}",
        std::process::id(),
        counts.delivered,
        counts.failed,
        counts.dead,
        counts.handed_back,
        counts.lost_leases
    );
    Ok(())
}

/// The sink `FORWARD_TO` names, for destinations under `prefix`.
async fn forward_to(broker: &str, prefix: &str) -> Result<Forward, String> {
    let name =
        |variable: &str| std::env::var(variable).map_err(|_| format!("{variable} is not set"));
    let unreachable = |error: &dyn std::fmt::Display| format!("cannot reach {broker}: {error}");
    Ok(match broker {
        "nats" => {
            let client =
                async_nats::connect("127.0.0.1:4222").await.map_err(|e| unreachable(&e))?;
            Forward::to(NatsSink::new(client, name("FORWARD_STREAM")?))
        }
        "rabbitmq" => {
            let uri = "amqp://guest:guest@127.0.0.1:5672/%2f";
            let properties = lapin::ConnectionProperties::default();
            Forward::to(RabbitSink::from_uri(uri, properties, name("FORWARD_EXCHANGE")?))
        }
        "redis" => {
            let client =
                redis::Client::open("redis://127.0.0.1:6379/").map_err(|e| unreachable(&e))?;
            let connection =
                redis::aio::ConnectionManager::new(client).await.map_err(|e| unreachable(&e))?;
            Forward::to(RedisSink::new(connection))
        }
        "kafka" => {
            let mut config = rdkafka::ClientConfig::new();
            config.set("bootstrap.servers", "127.0.0.1:9092");
            let sink = KafkaSink::new(&config).map_err(|e| unreachable(&e))?;
            Forward::to(sink.topics([format!("{prefix}.job.job.run")]).create_missing_topics(3, 1))
        }
        other => {
            return Err(format!("FORWARD_TO={other:?}: expected nats, rabbitmq, redis or kafka"))
        }
    })
}

/// Which delivery of its event a handler call is, from 1: the failed attempts and expired
/// leases before it, plus one.
fn delivery<S>(ctx: &EventContext<S>) -> u32 {
    ctx.attempts() + ctx.expired_leases() + 1
}
