//! Faults with real processes against the real PostgreSQL: a relay SIGKILLed mid-drain and
//! restarted loses nothing and delivers again only what it held; several relays with failing
//! handlers end with every event published or dead, attempts and errors consistent, memory flat.
//!
//! The relay is the `relay-process` binary (`tests/bin/relay_process.rs`); its handler records
//! every delivery as `(event_id, attempt, pid, ok)` in a `deliveries` table created here, apart
//! from the acknowledgement, so the table shows what handlers saw, duplicates included.
//! `OUTBOX_SOAK_EVENTS` sets the soak's size (default 5,000).
//!
//! Every test runs as production does: the outbox's statistics are those of the empty table
//! (analyzed before the backlog arrived, autovacuum off so they stay so), and both cores are
//! kept busy by a CPU burner for the whole test.

mod support;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;
use support::kafka::Topics;
use support::nats::Stream;
use support::rabbitmq::Exchange;
use support::redis::Streams;
use support::relay_process::{JobRun, RelayProcess};
use support::{migrated, CpuBurner};
use tokio::time::Instant;
use uuid::Uuid;

/// How many times each kind of warning or error appears in a relay's log, for the test output.
fn log_summary(log: &str) -> HashMap<String, usize> {
    let mut kinds = HashMap::new();
    for line in log.lines().filter(|line| line.contains(" WARN ") || line.contains(" ERROR ")) {
        // `<time> <LEVEL> <spans>: <module>: <message> <fields>`: keep the message's first words.
        let message = line.rsplit(": ").next().unwrap_or(line);
        let kind: String = message.split_whitespace().take(6).collect::<Vec<_>>().join(" ");
        *kinds.entry(kind).or_default() += 1;
    }
    kinds
}

/// How long a test may keep the cores busy at most.
const BURN_LIMIT: Duration = Duration::from_secs(600);

/// Migrates, analyzes the empty outbox, creates `deliveries`, and emits `events` jobs numbered
/// from 0; returns their ids.
async fn prepare(pool: &PgPool, events: u64) -> Vec<Uuid> {
    migrated(pool).await;
    sqlx::raw_sql(
        "ALTER TABLE outbox.events SET (autovacuum_enabled = false); ANALYZE outbox.events",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "CREATE TABLE deliveries \
         (event_id uuid NOT NULL, attempt int NOT NULL, pid int NOT NULL, ok bool NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
    let jobs: Vec<JobRun> = (0..events).map(|n| JobRun { job: n, n }).collect();
    let mut ids = Vec::with_capacity(jobs.len());
    for batch in jobs.chunks(1_000) {
        let mut tx = pool.begin().await.unwrap();
        ids.extend(outbox_runtime::emit_all(&mut tx, batch).await.unwrap());
        tx.commit().await.unwrap();
    }
    ids
}

async fn count(pool: &PgPool, condition: &str) -> u64 {
    let sql = format!("SELECT count(*) FROM outbox.events WHERE {condition}");
    let n: i64 = sqlx::query_scalar(sqlx::static_sql(sql)).fetch_one(pool).await.unwrap();
    n as u64
}

const PUBLISHED: &str = "published_at IS NOT NULL";
const PENDING: &str = "published_at IS NULL AND dead_at IS NULL";
const SETTLED: &str = "published_at IS NOT NULL OR dead_at IS NOT NULL";

/// Polls `check` every 10 ms; panics after `limit`.
async fn wait_until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `(attempt, ok)` of every recorded delivery, per event, in attempt order.
async fn deliveries(pool: &PgPool) -> HashMap<Uuid, Vec<(i32, bool)>> {
    let rows: Vec<(Uuid, i32, bool)> =
        sqlx::query_as("SELECT event_id, attempt, ok FROM deliveries ORDER BY event_id, attempt")
            .fetch_all(pool)
            .await
            .unwrap();
    let mut per_event: HashMap<Uuid, Vec<(i32, bool)>> = HashMap::new();
    for (event_id, attempt, ok) in rows {
        per_event.entry(event_id).or_default().push((attempt, ok));
    }
    per_event
}

/// The final state of one outbox row.
#[derive(sqlx::FromRow)]
struct Outcome {
    event_id: Uuid,
    job: String,
    published: bool,
    dead: bool,
    attempts: i32,
    expired_leases: i32,
    last_error: Option<String>,
}

async fn outcomes(pool: &PgPool) -> Vec<Outcome> {
    sqlx::query_as(
        "SELECT event_id, aggregate_id AS job, published_at IS NOT NULL AS published, \
                dead_at IS NOT NULL AS dead, attempts, expired_leases, last_error \
         FROM outbox.events",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

const CRASH_EVENTS: u64 = 5_000;
const KILLS: u64 = 4;

/// The batches a relay in the held-transaction lease mode has in flight at most.
const HELD_BATCHES_IN_FLIGHT: usize = 4;

/// A relay with leases of `lease_ms`, and attempts enough for every kill.
fn crash_relay(lease_ms: &str) -> [(&str, &str); 6] {
    [
        ("RELAY_CONCURRENCY", "16"),
        ("RELAY_BATCH_SIZE", "50"),
        ("RELAY_LEASE_TIMEOUT_MS", lease_ms),
        ("RELAY_MAX_ATTEMPTS", "100"),
        ("RELAY_POLL_INTERVAL_MS", "50"),
        ("HANDLER_SLEEP_MS", "2"),
    ]
}

/// Short leases, so a killed relay's rows come back quickly, with room for a renewal that waits
/// a second on a lock (the one-second leases of the test below do not have it).
const CRASH_LEASE_MS: &str = "3000";

#[sqlx::test(migrations = false)]
async fn a_relay_killed_mid_drain_loses_nothing_and_repeats_only_what_it_held(pool: PgPool) {
    let _burner = CpuBurner::start(BURN_LIMIT);
    let started = Instant::now();
    let ids = prepare(&pool, CRASH_EVENTS).await;

    // After each kill, the rows a dead relay still holds a lease on: the only ones a handler
    // may have seen without the acknowledgement committing, so the only ones that may repeat.
    let mut held_at_kill: Vec<HashSet<Uuid>> = Vec::new();
    let mut relay = RelayProcess::spawn(&pool, &crash_relay(CRASH_LEASE_MS));
    for kill in 1..=KILLS {
        let target = CRASH_EVENTS * kill / (KILLS + 1);
        wait_until(&format!("{target} events are published"), Duration::from_secs(60), || async {
            count(&pool, PUBLISHED).await >= target
        })
        .await;
        let pid = relay.pid();
        let log = relay.kill();
        // Not atomic with the kill, so taken right after it: statements the dead relay had sent
        // may still commit, which only makes this set larger than necessary (a publish) or
        // leaves out rows it never received (a lease).
        let held: HashSet<Uuid> = sqlx::query_scalar(
            "SELECT event_id FROM outbox.events \
             WHERE published_at IS NULL AND lease_token IS NOT NULL",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
        let pending = count(&pool, PENDING).await;
        println!(
            "kill {kill}: relay {pid} SIGKILLed, {pending} pending, {} leased; log {:?}",
            held.len(),
            log_summary(&log)
        );
        assert!(pending > 0, "kill {kill} came after the drain");
        held_at_kill.push(held);
        relay = RelayProcess::spawn(&pool, &crash_relay(CRASH_LEASE_MS));
    }
    assert!(held_at_kill.iter().any(|held| !held.is_empty()), "no kill caught a relay mid-batch");
    wait_until("the last relay drains the outbox", Duration::from_secs(60), || async {
        count(&pool, PENDING).await == 0
    })
    .await;
    let (last, log) = relay.terminate().await;
    println!("last relay: {last:?}; log {:?}", log_summary(&log));
    assert_eq!(last.lost_leases, 0, "one relay at a time: no lease is taken from a live relay");

    let rows = outcomes(&pool).await;
    assert_eq!(rows.len(), ids.len());
    let seen = deliveries(&pool).await;
    let (mut duplicates, mut repeated) = (0, 0);
    for row in &rows {
        let id = row.event_id;
        assert!(row.published && !row.dead, "event {id} is published, not pending or dead");
        let attempts: Vec<i32> = seen.get(&id).into_iter().flatten().map(|&(a, _)| a).collect();
        assert!(!attempts.is_empty(), "event {id} was never delivered");
        assert!(attempts.windows(2).all(|w| w[0] < w[1]), "event {id}: attempts {attempts:?}");
        assert_eq!(row.attempts, 0, "event {id}: no delivery failed");
        assert_eq!(
            attempts.last(),
            Some(&(row.expired_leases + 1)),
            "event {id}: the published delivery is the attempt after the expired leases"
        );
        let times_held = held_at_kill.iter().filter(|held| held.contains(&id)).count();
        if attempts.len() > 1 {
            assert!(
                attempts.len() <= 1 + times_held,
                "event {id} delivered {} times, but held by a killed relay {times_held} times",
                attempts.len()
            );
            duplicates += attempts.len() - 1;
            repeated += 1;
        }
    }
    let bound: usize = held_at_kill.iter().map(HashSet::len).sum();
    println!(
        "{CRASH_EVENTS} events, {KILLS} kills: {duplicates} duplicate deliveries of {repeated} \
         events, bound {bound} (rows held by a killed relay); {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(duplicates <= bound);
}

/// The same kills with `delete_on_publish`, both cores busy, on empty-table statistics: every
/// event is delivered and its row deleted, and only rows a killed relay held are delivered twice.
#[sqlx::test(migrations = false)]
async fn a_relay_deleting_on_publish_killed_mid_drain_loses_nothing(pool: PgPool) {
    let _burner = CpuBurner::start(BURN_LIMIT);
    let ids = prepare(&pool, CRASH_EVENTS).await;
    let settings = crash_relay(CRASH_LEASE_MS);
    let settings: Vec<(&str, &str)> =
        settings.into_iter().chain([("RELAY_DELETE_ON_PUBLISH", "1")]).collect();
    let mut held_at_kill: HashSet<Uuid> = HashSet::new();
    let mut relay = RelayProcess::spawn(&pool, &settings);
    for kill in 1..=KILLS {
        let target = CRASH_EVENTS - CRASH_EVENTS * kill / (KILLS + 1);
        wait_until(&format!("{target} events are left"), Duration::from_secs(60), || async {
            count(&pool, "true").await <= target
        })
        .await;
        relay.kill();
        let held: Vec<Uuid> =
            sqlx::query_scalar("SELECT event_id FROM outbox.events WHERE lease_token IS NOT NULL")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert!(count(&pool, "true").await > 0, "kill {kill} came after the drain");
        held_at_kill.extend(held);
        relay = RelayProcess::spawn(&pool, &settings);
    }
    wait_until("the last relay empties the outbox", Duration::from_secs(60), || async {
        count(&pool, "true").await == 0
    })
    .await;
    // Empty: nothing is pending, and nothing died (dead rows are kept).
    let (last, _) = relay.terminate().await;
    assert_eq!(last.lost_leases, 0, "one relay at a time: no lease is taken from a live relay");

    let seen = deliveries(&pool).await;
    let mut repeated = 0;
    for id in &ids {
        let attempts = seen.get(id).map_or(0, Vec::len);
        assert!(attempts >= 1, "event {id} was never delivered");
        if attempts > 1 {
            assert!(held_at_kill.contains(id), "event {id} repeated, but no killed relay held it");
            repeated += 1;
        }
    }
    println!("{CRASH_EVENTS} events, {KILLS} kills, deleting on publish: {repeated} repeated");
}

/// Whether the relay `pid` is mid-batch: it recorded deliveries whose rows are still pending.
async fn mid_batch(pool: &PgPool, pid: u32) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM deliveries d JOIN outbox.events e USING (event_id) \
                        WHERE d.pid = $1 AND e.published_at IS NULL)",
    )
    .bind(pid as i32)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The same kills in the held-transaction mode, both cores busy: a killed relay's transaction
/// dies with its connection, and its row locks with it, so its batch is delivered again at once
/// with nothing counted (no attempt, no expired lease, no lease token left); only deliveries of
/// killed relays repeat, at most a batch per kill.
#[sqlx::test(migrations = false)]
async fn a_held_transaction_relay_killed_mid_drain_loses_nothing(pool: PgPool) {
    let _burner = CpuBurner::start(BURN_LIMIT);
    let started = Instant::now();
    let ids = prepare(&pool, CRASH_EVENTS).await;
    let mut settings = crash_relay(CRASH_LEASE_MS).to_vec();
    settings.push(("RELAY_HELD_TRANSACTION", "1"));
    let batch = settings.iter().find(|(name, _)| *name == "RELAY_BATCH_SIZE").unwrap().1;
    let batch: usize = batch.parse().unwrap();
    let mut killed: HashSet<i32> = HashSet::new();
    let mut relay = RelayProcess::spawn(&pool, &settings);
    for kill in 1..=KILLS {
        let target = CRASH_EVENTS * kill / (KILLS + 1);
        let pid = relay.pid();
        // Killed mid-batch (most likely still so when the signal lands), so that there are
        // deliveries whose outcomes the kill loses.
        wait_until(
            &format!("{target} events are published and relay {pid} is mid-batch"),
            Duration::from_secs(60),
            || async { count(&pool, PUBLISHED).await >= target && mid_batch(&pool, pid).await },
        )
        .await;
        let log = relay.kill();
        killed.insert(pid as i32);
        let pending = count(&pool, PENDING).await;
        println!(
            "kill {kill}: relay {pid} SIGKILLed, {pending} pending; log {:?}",
            log_summary(&log)
        );
        assert!(pending > 0, "kill {kill} came after the drain");
        relay = RelayProcess::spawn(&pool, &settings);
    }
    wait_until("the last relay drains the outbox", Duration::from_secs(60), || async {
        count(&pool, PENDING).await == 0
    })
    .await;
    let last_pid = relay.pid() as i32;
    let (last, log) = relay.terminate().await;
    println!("last relay: {last:?}; log {:?}", log_summary(&log));

    let rows: Vec<(Uuid, bool, bool, i32, i32, bool)> = sqlx::query_as(
        "SELECT event_id, published_at IS NOT NULL, dead_at IS NOT NULL, attempts, \
                expired_leases, lease_token IS NOT NULL FROM outbox.events",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), ids.len());
    let mut by_event: HashMap<Uuid, Vec<i32>> = HashMap::new();
    let recorded: Vec<(Uuid, i32, i32)> =
        sqlx::query_as("SELECT event_id, attempt, pid FROM deliveries")
            .fetch_all(&pool)
            .await
            .unwrap();
    for (event_id, attempt, pid) in recorded {
        assert_eq!(attempt, 1, "event {event_id}: no delivery saw an attempt or expiry counted");
        by_event.entry(event_id).or_default().push(pid);
    }
    let (mut duplicates, mut repeated) = (0, 0);
    for (id, published, dead, attempts, expired_leases, leased) in rows {
        assert!(published && !dead, "event {id} is published, not pending or dead");
        assert_eq!((attempts, expired_leases, leased), (0, 0, false), "event {id}");
        let pids = by_event.get(&id).map(Vec::as_slice).unwrap_or_default();
        assert!(!pids.is_empty(), "event {id} was never delivered");
        // A relay delivers a row once: its lock keeps the row until the outcome commits.
        let distinct: HashSet<&i32> = pids.iter().collect();
        assert_eq!(distinct.len(), pids.len(), "event {id}: a relay delivered it twice: {pids:?}");
        // One relay at a time, and only the last one lived on: every delivery but its own was
        // a killed relay's, and came before it.
        assert!(
            pids.iter().all(|pid| killed.contains(pid) || *pid == last_pid),
            "event {id} delivered by {pids:?}; killed {killed:?}, last {last_pid}"
        );
        if pids.len() > 1 {
            duplicates += pids.len() - 1;
            repeated += 1;
        }
    }
    // A held relay has up to four batches in flight (README: "up to four batches overlap"),
    // each a transaction of its own: a kill loses the outcomes of all of them.
    let bound = KILLS as usize * HELD_BATCHES_IN_FLIGHT * batch;
    println!(
        "{CRASH_EVENTS} events, {KILLS} kills, held transactions: {duplicates} duplicate \
         deliveries of {repeated} events, bound {bound} (the batches in flight, per kill); {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(duplicates <= bound, "each kill repeats at most the batches it held");
}

/// Leases of a few seconds, short enough that a renewal held up (a plan that scans the outbox,
/// a lock wait, a starved process) makes them expire.
const SHORT_LEASE_MS: &str = "2000";

/// One relay, two-second leases (renewed every 667 ms), no fault but a busy CPU: renewals and
/// acknowledgements of the same rows run side by side, and a renewal held up past the lease
/// timeout would make the relay give up rows it is delivering and deliver them again.
#[sqlx::test(migrations = false)]
async fn a_lone_relay_with_short_leases_delivers_each_event_once(pool: PgPool) {
    let _burner = CpuBurner::start(BURN_LIMIT);
    prepare(&pool, CRASH_EVENTS).await;
    let relay = RelayProcess::spawn(&pool, &crash_relay(SHORT_LEASE_MS));
    wait_until("the relay drains the outbox", Duration::from_secs(60), || async {
        count(&pool, PENDING).await == 0
    })
    .await;
    let (counts, log) = relay.terminate().await;

    let seen = deliveries(&pool).await;
    let repeated = seen.values().filter(|attempts| attempts.len() > 1).count();
    let duplicates = seen.values().map(Vec::len).sum::<usize>() - seen.len();
    let expired = count(&pool, "expired_leases > 0 OR attempts > 0").await;
    let summary = log_summary(&log);
    println!(
        "lone relay, {SHORT_LEASE_MS} ms leases: {duplicates} duplicate deliveries of {repeated} events, \
         {expired} events with an expired lease counted, {counts:?}; log {summary:?}"
    );
    assert_eq!(seen.len() as u64, CRASH_EVENTS, "every event delivered");
    assert!(
        duplicates == 0 && expired == 0 && counts.lost_leases == 0,
        "a lone, live relay delivered {repeated} events more than once ({duplicates} extra \
         deliveries), let {expired} leases expire and lost {} acknowledgements; its log: \
         {summary:?}",
        counts.lost_leases
    );
}

const BACKLOG_EVENTS: u64 = 6_000;

/// Three relays with short leases start together on a backlog: none of them dies or
/// pauses, so no lease expires, no event is delivered twice, none dies, and no statement fails
/// (relays never deadlock each other).
#[sqlx::test(migrations = false)]
async fn relays_starting_on_a_backlog_deliver_each_event_once(pool: PgPool) {
    let _burner = CpuBurner::start(BURN_LIMIT);
    prepare(&pool, BACKLOG_EVENTS).await;
    let settings = [
        ("RELAY_CONCURRENCY", "16"),
        ("RELAY_BATCH_SIZE", "100"),
        ("RELAY_LEASE_TIMEOUT_MS", SHORT_LEASE_MS),
        ("RELAY_MAX_ATTEMPTS", "10"),
        ("RELAY_POLL_INTERVAL_MS", "50"),
        ("HANDLER_SLEEP_MS", "1"),
    ];
    let started = Instant::now();
    let relays: Vec<RelayProcess> = (0..3).map(|_| RelayProcess::spawn(&pool, &settings)).collect();
    wait_until("the relays drain the backlog", Duration::from_secs(120), || async {
        count(&pool, PENDING).await == 0
    })
    .await;
    let drained = started.elapsed();
    let (mut lost, mut warnings) = (0, Vec::new());
    for relay in relays {
        let (counts, log) = relay.terminate().await;
        let summary = log_summary(&log);
        println!("relay: {counts:?}; log {summary:?}");
        lost += counts.lost_leases;
        warnings.extend(summary);
    }

    let seen = deliveries(&pool).await;
    let repeated = seen.values().filter(|attempts| attempts.len() > 1).count();
    let expired = count(&pool, "expired_leases > 0").await;
    let dead = count(&pool, "dead_at IS NOT NULL").await;
    println!(
        "{BACKLOG_EVENTS} events, 3 relays, empty-table statistics, cores busy: drained in \
         {:.1} s; {repeated} events delivered more than once, {expired} with an expired lease, \
         {dead} dead, {lost} acknowledgements lost",
        drained.as_secs_f64()
    );
    assert_eq!(seen.len() as u64, BACKLOG_EVENTS, "every event delivered");
    assert_eq!((repeated, expired, dead, lost), (0, 0, 0, 0));
    assert!(warnings.is_empty(), "no deadlock, no failed statement, no warning: {warnings:?}");
}

/// Two relays with transactional handlers and short leases drain a backlog with no fault but
/// a busy CPU: each event is recorded exactly once, and neither relay logs a single warning (a
/// warning must mean something is wrong).
#[sqlx::test(migrations = false)]
async fn transactional_handlers_deliver_exactly_once_without_a_warning(pool: PgPool) {
    let _burner = CpuBurner::start(BURN_LIMIT);
    prepare(&pool, CRASH_EVENTS).await;
    let mut settings = crash_relay(SHORT_LEASE_MS).to_vec();
    settings.push(("HANDLER_TRANSACTIONAL", "1"));
    settings.push(("RELAY_LOG", "warn,outbox_runtime=debug"));
    let relays: Vec<RelayProcess> = (0..2).map(|_| RelayProcess::spawn(&pool, &settings)).collect();
    wait_until("the relays drain the outbox", Duration::from_secs(120), || async {
        count(&pool, PENDING).await == 0
    })
    .await;
    let mut warnings = Vec::new();
    for relay in relays {
        let (counts, log) = relay.terminate().await;
        let summary = log_summary(&log);
        println!("transactional relay: {counts:?}; log {summary:?}");
        if !summary.is_empty() {
            println!("{log}");
        }
        assert_eq!(counts.lost_leases, 0);
        warnings.extend(summary);
    }
    let seen = deliveries(&pool).await;
    let repeated = seen.values().filter(|attempts| attempts.len() > 1).count();
    assert_eq!(seen.len() as u64, CRASH_EVENTS, "every event recorded");
    assert_eq!(repeated, 0, "recorded with the acknowledgement: exactly once");
    assert_eq!(count(&pool, "expired_leases > 0 OR attempts > 0").await, 0);
    assert!(warnings.is_empty(), "warnings without a fault: {warnings:?}");
}

const FORWARD_EVENTS: u64 = 3_000;

/// Runs a forwarding relay process with `settings` over [`FORWARD_EVENTS`] prepared events,
/// SIGKILLs it three times mid-drain (restarting it each time) and lets the last one drain.
/// Returns the event ids, and the rows a killed forwarder held at each kill: the only ones it
/// may have published to the broker without the acknowledgement committing.
async fn kill_a_forwarder(pool: &PgPool, settings: &[(&str, &str)]) -> (HashSet<Uuid>, usize) {
    let ids: HashSet<Uuid> = prepare(pool, FORWARD_EVENTS).await.into_iter().collect();
    let mut held_at_kills = 0;
    let mut relay = RelayProcess::spawn(pool, settings);
    for kill in 1..=3 {
        let target = FORWARD_EVENTS * kill / 4;
        wait_until(&format!("{target} events are published"), Duration::from_secs(60), || async {
            count(pool, PUBLISHED).await >= target
        })
        .await;
        let log = relay.kill();
        held_at_kills += count(pool, "published_at IS NULL AND lease_token IS NOT NULL").await;
        println!("forwarder kill {kill}: log {:?}", log_summary(&log));
        relay = RelayProcess::spawn(pool, settings);
    }
    wait_until("the last forwarder drains the outbox", Duration::from_secs(60), || async {
        count(pool, PENDING).await == 0
    })
    .await;
    let (counts, log) = relay.terminate().await;
    println!("last forwarder: {counts:?}; log {:?}", log_summary(&log));
    assert_eq!(count(pool, "dead_at IS NOT NULL").await, 0);
    (ids, held_at_kills as usize)
}

/// Every event among `received` (the broker's message ids, repeats included), and repeats no
/// more than the rows the killed forwarders held.
fn assert_at_least_once(ids: &HashSet<Uuid>, received: &[Uuid], held_at_kills: usize) {
    let distinct: HashSet<Uuid> = received.iter().copied().collect();
    let repeats = received.len() - distinct.len();
    println!(
        "{FORWARD_EVENTS} events, 3 kills: {} messages, {repeats} repeats, bound {held_at_kills}",
        received.len()
    );
    assert_eq!(&distinct, ids, "every event reached the broker");
    assert!(
        repeats <= held_at_kills,
        "{repeats} repeats, but killed forwarders held {held_at_kills}"
    );
}

/// JetStream: the repeats a kill causes carry the same `Nats-Msg-Id`, which the stream's
/// duplicate window drops, so the stream holds each event exactly once.
#[sqlx::test(migrations = false)]
async fn a_forwarder_killed_mid_batch_loses_nothing_and_jetstream_drops_the_repeats(pool: PgPool) {
    let _burner = CpuBurner::start(BURN_LIMIT);
    let stream = Stream::create(Duration::from_secs(600)).await;
    let mut settings = crash_relay(CRASH_LEASE_MS).to_vec();
    settings.extend([
        ("FORWARD_TO", "nats"),
        ("FORWARD_STREAM", &stream.name),
        ("FORWARD_PREFIX", &stream.prefix),
    ]);
    let (ids, held_at_kills) = kill_a_forwarder(&pool, &settings).await;
    let received: Vec<Uuid> = stream.message_ids().await;
    assert_at_least_once(&ids, &received, held_at_kills);
    assert_eq!(received.len(), ids.len(), "and each once");
}

/// RabbitMQ does not deduplicate: repeats reach the queue, bounded by what the killed
/// forwarders held; consumers deduplicate by `message_id`.
#[sqlx::test(migrations = false)]
async fn a_forwarder_killed_mid_batch_loses_nothing_on_rabbitmq(pool: PgPool) {
    let _burner = CpuBurner::start(BURN_LIMIT);
    let exchange = Exchange::create().await;
    let mut settings = crash_relay(CRASH_LEASE_MS).to_vec();
    settings.extend([
        ("FORWARD_TO", "rabbitmq"),
        ("FORWARD_EXCHANGE", &exchange.name),
        ("FORWARD_PREFIX", &exchange.prefix),
    ]);
    let (ids, held_at_kills) = kill_a_forwarder(&pool, &settings).await;
    let received: Vec<Uuid> = exchange
        .messages()
        .await
        .iter()
        .map(|message| message.message_id.as_deref().unwrap().parse().unwrap())
        .collect();
    assert_at_least_once(&ids, &received, held_at_kills);
}

/// Redis Streams does not deduplicate either: repeats bounded likewise; consumers deduplicate
/// by the `id` field.
#[sqlx::test(migrations = false)]
async fn a_forwarder_killed_mid_batch_loses_nothing_on_redis(pool: PgPool) {
    let _burner = CpuBurner::start(BURN_LIMIT);
    let streams = Streams::create().await;
    let mut settings = crash_relay(CRASH_LEASE_MS).to_vec();
    settings.extend([("FORWARD_TO", "redis"), ("FORWARD_PREFIX", &streams.prefix)]);
    let (ids, held_at_kills) = kill_a_forwarder(&pool, &settings).await;
    let key = format!("{}.job.job.run", streams.prefix);
    let received: Vec<Uuid> = streams
        .entries(&key)
        .await
        .iter()
        .map(|(_, fields)| fields.iter().find(|(name, _)| name == "id").unwrap().1.parse().unwrap())
        .collect();
    assert_at_least_once(&ids, &received, held_at_kills);
}

/// Kafka keeps no message id to drop a repeat by: repeats bounded likewise; consumers
/// deduplicate by the `outbox-event-id` header.
#[sqlx::test(migrations = false)]
async fn a_forwarder_killed_mid_batch_loses_nothing_on_kafka(pool: PgPool) {
    let _burner = CpuBurner::start(BURN_LIMIT);
    let topics = Topics::new();
    let mut settings = crash_relay(CRASH_LEASE_MS).to_vec();
    settings.extend([("FORWARD_TO", "kafka"), ("FORWARD_PREFIX", &topics.prefix)]);
    let (ids, held_at_kills) = kill_a_forwarder(&pool, &settings).await;
    let topic = format!("{}.job.job.run", topics.prefix);
    let received: Vec<Uuid> = topics
        .records(&topic, ids.len())
        .await
        .iter()
        .map(|record| record.header("outbox-event-id").unwrap().parse().unwrap())
        .collect();
    assert_at_least_once(&ids, &received, held_at_kills);
}

const SOAK_RELAYS: usize = 3;
const SOAK_MAX_ATTEMPTS: i32 = 4;
/// Every job whose number is a multiple of this fails every time, so some events die.
const POISON_EVERY: u64 = 250;
const FAIL_PERCENT: u64 = 10;
const MIB: u64 = 1024;

fn soak_events() -> u64 {
    std::env::var("OUTBOX_SOAK_EVENTS").map_or(5_000, |n| n.parse().expect("OUTBOX_SOAK_EVENTS"))
}

#[sqlx::test(migrations = false)]
async fn relays_with_failing_handlers_settle_every_event_consistently_in_flat_memory(pool: PgPool) {
    let _burner = CpuBurner::start(BURN_LIMIT);
    let total = soak_events();
    let ids = prepare(&pool, total).await;
    let (max_attempts, poison, fail) =
        (SOAK_MAX_ATTEMPTS.to_string(), POISON_EVERY.to_string(), FAIL_PERCENT.to_string());
    // No kills here: leases long enough that none expires on a loaded machine.
    let settings = [
        ("RELAY_CONCURRENCY", "8"),
        ("RELAY_BATCH_SIZE", "20"),
        ("RELAY_LEASE_TIMEOUT_MS", "10000"),
        ("RELAY_MAX_ATTEMPTS", &max_attempts),
        ("RELAY_POLL_INTERVAL_MS", "50"),
        ("FAIL_PERCENT", &fail),
        ("POISON_EVERY", &poison),
        ("HANDLER_SLEEP_MS", "1"),
    ];
    let started = Instant::now();
    let relays: Vec<RelayProcess> =
        (0..SOAK_RELAYS).map(|_| RelayProcess::spawn(&pool, &settings)).collect();
    let limit = Duration::from_secs(60 + total / 200);

    wait_until("a quarter of the events are settled", limit, || async {
        count(&pool, SETTLED).await >= total / 4
    })
    .await;
    let quarter: Vec<u64> = relays.iter().map(RelayProcess::rss_kib).collect();
    wait_until("nothing is pending", limit, || async { count(&pool, PENDING).await == 0 }).await;
    let end: Vec<u64> = relays.iter().map(RelayProcess::rss_kib).collect();
    let elapsed = started.elapsed();
    let pids: Vec<u32> = relays.iter().map(RelayProcess::pid).collect();
    let mut counts = Vec::new();
    for relay in relays {
        let (relay_counts, log) = relay.terminate().await;
        println!("relay {}: {relay_counts:?}; log {:?}", pids[counts.len()], log_summary(&log));
        counts.push(relay_counts);
    }

    // Memory: flat from a quarter of the way to the end, and small.
    for ((pid, quarter), end) in pids.iter().zip(&quarter).zip(&end) {
        println!(
            "relay {pid}: VmRSS {:.1} MiB at 25%, {:.1} MiB at 100%",
            *quarter as f64 / MIB as f64,
            *end as f64 / MIB as f64
        );
        assert!(
            end.saturating_sub(*quarter) < 20 * MIB,
            "relay {pid} grew: {quarter} -> {end} KiB"
        );
        assert!(*end < 64 * MIB, "relay {pid} uses {end} KiB");
    }

    // Every event published or dead, and its attempts, errors and deliveries agree.
    let rows = outcomes(&pool).await;
    assert_eq!(rows.len(), ids.len());
    let seen = deliveries(&pool).await;
    let (mut published, mut dead, mut failures) = (0, 0, 0);
    for row in &rows {
        let (id, job) = (row.event_id, &row.job);
        assert!(row.published != row.dead, "event {id} is either published or dead");
        let delivered = seen.get(&id).map(Vec::as_slice).unwrap_or_default();
        let attempts: Vec<i32> = delivered.iter().map(|&(attempt, _)| attempt).collect();
        let expected: Vec<i32> = (1..=delivered.len() as i32).collect();
        assert_eq!(attempts, expected, "event {id}: attempts 1..=n, each exactly once");
        let (&(_, last_ok), earlier) = delivered.split_last().expect("delivered at least once");
        assert!(
            earlier.iter().all(|&(_, ok)| !ok),
            "event {id}: only the last attempt may succeed"
        );
        let last_failure =
            (row.attempts > 0).then(|| format!("job {job} failed on attempt {}", row.attempts));
        assert_eq!(row.last_error, last_failure, "event {id}: last_error is the last failure");
        if row.published {
            assert!(last_ok, "event {id} is published after a successful delivery");
            assert_eq!(row.attempts, attempts.len() as i32 - 1, "event {id}: failures counted");
            published += 1;
        } else {
            assert!(!last_ok, "dead event {id} never succeeded");
            assert_eq!(row.attempts, SOAK_MAX_ATTEMPTS, "event {id} died at max_attempts");
            dead += 1;
        }
        if job.parse::<u64>().unwrap() % POISON_EVERY == 0 {
            assert!(row.dead, "poisoned job {job} is dead");
        }
        failures += row.attempts as u64;
    }
    // No kills and long leases: no delivery beyond one per failure plus the successful one.
    assert_eq!(seen.len(), rows.len(), "no delivery of an unknown event");
    let recorded = seen.values().map(Vec::len).sum::<usize>() as u64;
    let duplicates = recorded - (failures + published);
    assert_eq!(duplicates, 0);

    // The relays' own counts agree with the table, and each took a share.
    let by_pid: HashMap<i32, i64> =
        sqlx::query_as("SELECT pid, count(*) FROM deliveries GROUP BY pid")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();
    for pid in &pids {
        assert!(by_pid.get(&(*pid as i32)).is_some_and(|&n| n > 0), "relay {pid} took work");
    }
    assert_eq!(counts.iter().map(|c| c.delivered).sum::<u64>(), published);
    assert_eq!(counts.iter().map(|c| c.failed).sum::<u64>(), failures);
    assert_eq!(counts.iter().map(|c| c.lost_leases).sum::<u64>(), 0);
    println!(
        "{total} events, {SOAK_RELAYS} relays, {FAIL_PERCENT}% failing: {published} published, {dead} dead \
         ({} poisoned), {failures} failed deliveries, {duplicates} duplicates; deliveries per \
         relay {by_pid:?}; {:.1} s",
        total.div_ceil(POISON_EVERY),
        elapsed.as_secs_f64()
    );
}
