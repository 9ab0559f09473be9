//! The inbox consuming a Redis stream through a consumer group, end to end on the real server:
//! a relay forwards events to a stream key of the test's own, the broker is made to deliver
//! some twice, and an inbox consumer in a process of its own is SIGKILLed mid-stream and
//! started again, under its own name and then under another. Repeats at the broker, none at the
//! effect; nothing left pending in the group. Then retries and poison, a database outage that
//! spends no attempt, a Redis connection cut mid-stream, and stream order kept across a retry.

mod support;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::redis::aio::ConnectionManager;
use ::redis::streams::{StreamInfoGroupsReply, StreamPendingCountReply, StreamReadReply};
use ::redis::{AsyncCommands, RedisError};
use outbox_runtime::forward::Forward;
use outbox_runtime::inbox::redis::{consume, GroupReader};
use outbox_runtime::inbox::{Inbox, InboxContext};
use outbox_runtime::{Backoff, Relay};
use sqlx::PgPool;
use support::inbox::{create_effects, effects};
use support::proxy::Proxy;
use support::redis::Streams;
use support::relay_process::JobRun;
use support::*;
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;
use uuid::Uuid;

/// An `inbox-process-redis` child, killed when dropped so a failing test leaves none behind.
struct Consumer(Child);

impl Consumer {
    fn spawn(pool: &PgPool, key: &str, group: &str, name: &str, claim_idle: Duration) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_inbox-process-redis"))
            .args([&database_url(pool), key, group, name])
            .env("CLAIM_IDLE_MS", claim_idle.as_millis().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("inbox-process-redis starts");
        Consumer(child)
    }

    fn kill(mut self) {
        self.0.kill().expect("SIGKILL is delivered");
        self.0.wait().expect("the killed consumer is reaped");
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `consume` running in this process until `stop`.
struct Consuming {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), RedisError>>,
}

impl Consuming {
    fn start<S: Clone + Send + Sync + 'static>(
        inbox: &Inbox<S>,
        connection: ConnectionManager,
        reader: GroupReader,
    ) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let inbox = inbox.clone();
        let task = tokio::spawn(async move {
            consume(&inbox, connection, &reader, async {
                let _ = stopped.await;
            })
            .await
        });
        Consuming { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let stopped = within(self.task, "consume returns after its shutdown").await;
        stopped.unwrap().expect("consume stops cleanly");
    }
}

/// Emits `count` jobs and forwards them to the stream `key` with a relay; returns their event
/// ids, in stream order (one transaction, forwarded in emit order).
async fn forwarded(pool: &PgPool, streams: &Streams, key: &str, count: u64) -> Vec<Uuid> {
    let mut ids = Vec::new();
    let mut tx = pool.begin().await.unwrap();
    for job in 0..count {
        ids.push(outbox_runtime::emit(&mut tx, &JobRun { job, n: job }).await.unwrap());
    }
    tx.commit().await.unwrap();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .forward(Forward::to(streams.sink().await).destination(key)),
    );
    eventually("every job is in the stream", || async {
        streams.entries(key).await.len() as u64 == count
    })
    .await;
    relay.stop().await;
    ids
}

/// Appends copies of the first `count` entries of `key` (the same fields, new entry ids): the
/// broker delivers those events twice.
async fn duplicated_at_the_broker(streams: &Streams, key: &str, count: usize) {
    let mut connection = streams.connection.clone();
    for (_, fields) in streams.entries(key).await.into_iter().take(count) {
        let _: String = connection.xadd(key, "*", &fields).await.unwrap();
    }
}

async fn create_group(streams: &Streams, key: &str, group: &str) {
    let mut connection = streams.connection.clone();
    let () = connection.xgroup_create(key, group, "0").await.unwrap();
}

/// Reads `count` new entries as `consumer` and acknowledges none: what a consumer holds when
/// it dies. Returns their ids.
async fn taken_by(streams: &Streams, key: &str, group: &str, consumer: &str) -> Vec<String> {
    let mut connection = streams.connection.clone();
    let options = ::redis::streams::StreamReadOptions::default().group(group, consumer).count(5);
    let read: StreamReadReply = connection.xread_options(&[key], &[">"], &options).await.unwrap();
    let ids: Vec<String> = read.keys[0].ids.iter().map(|entry| entry.id.clone()).collect();
    assert_eq!(ids.len(), 5);
    ids
}

/// The group's pending entries: `(entry id, consumer)`; none before the group is created.
async fn pending(streams: &Streams, key: &str, group: &str) -> Vec<(String, String)> {
    let mut connection = streams.connection.clone();
    let reply: Result<StreamPendingCountReply, RedisError> =
        connection.xpending_count(key, group, "-", "+", 10_000).await;
    let reply = match reply {
        Err(error) if error.code() == Some("NOGROUP") => return Vec::new(),
        reply => reply.unwrap(),
    };
    reply.ids.into_iter().map(|pending| (pending.id, pending.consumer)).collect()
}

fn held_by(pending: &[(String, String)], consumer: &str) -> Vec<String> {
    pending.iter().filter(|(_, by)| by == consumer).map(|(id, _)| id.clone()).collect()
}

/// Whether the group was given every entry of the stream and has none left pending: every
/// entry settled.
async fn settled(streams: &Streams, key: &str, group: &str) -> bool {
    let mut connection = streams.connection.clone();
    let info: StreamInfoGroupsReply = connection.xinfo_groups(key).await.unwrap();
    let Some(info) = info.groups.into_iter().find(|info| info.name == group) else {
        return false;
    };
    let last = streams.entries(key).await.pop().map(|(id, _)| id);
    info.pending == 0 && Some(info.last_delivered_id) == last
}

/// Which calls of a job's handler fail: `(job, call)`, calls counted from 1.
type Fails = fn(u64, u32) -> bool;

/// Each job's handler calls, and the jobs in the order their calls succeeded.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Record>>);

#[derive(Default)]
struct Record {
    calls: HashMap<u64, u32>,
    succeeded: Vec<u64>,
}

impl Calls {
    /// Counts a call of `job`'s handler; returns which call this is, from 1.
    fn call(&self, job: u64) -> u32 {
        let mut record = self.0.lock().unwrap();
        let call = record.calls.entry(job).or_insert(0);
        *call += 1;
        *call
    }

    fn succeeded(&self, job: u64) {
        self.0.lock().unwrap().succeeded.push(job);
    }

    fn of(&self, job: u64) -> u32 {
        self.0.lock().unwrap().calls.get(&job).copied().unwrap_or(0)
    }

    fn order(&self) -> Vec<u64> {
        self.0.lock().unwrap().succeeded.clone()
    }
}

/// An inbox named `consumer` whose handler counts calls, and fails the calls `fails` says.
fn counting_inbox(
    pool: PgPool,
    consumer: &str,
    calls: &Calls,
    max_attempts: u32,
    fails: Fails,
) -> Inbox<(Calls, Fails)> {
    Inbox::builder(pool, consumer)
        .state((calls.clone(), fails))
        .max_attempts(max_attempts)
        .backoff(Backoff {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(200),
            jitter: false,
        })
        .handler(|ctx: InboxContext<(Calls, Fails)>, job: JobRun| async move {
            let (calls, fails) = ctx.state();
            let call = calls.call(job.job);
            if fails(job.job, call) {
                return Err(HandlerError(format!("job {} failed call {call}", job.job)));
            }
            calls.succeeded(job.job);
            Ok(())
        })
        .build()
        .unwrap()
}

/// `(handled, dead, attempts recorded)` in the inbox of `consumer`.
async fn inbox_rows(pool: &PgPool, consumer: &str) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE handled_at IS NOT NULL), \
                count(*) FILTER (WHERE dead_at IS NOT NULL), coalesce(sum(attempts), 0) \
         FROM outbox.inbox WHERE consumer = $1",
    )
    .bind(consumer)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_consumer_killed_mid_stream_and_restarted_has_each_effect_once(pool: PgPool) {
    migrated(&pool).await;
    create_effects(&pool).await;
    let streams = Streams::create().await;
    let key = format!("{}.jobs", streams.prefix);
    let ids = forwarded(&pool, &streams, &key, 300).await;
    duplicated_at_the_broker(&streams, &key, 40).await;
    let group = "billing";
    create_group(&streams, &key, group).await;
    // Entries that `first` held when it died before this test, and entries held by a consumer
    // that never comes back.
    let mut held_by_first = taken_by(&streams, &key, group, "first").await;
    let held_by_gone = taken_by(&streams, &key, group, "gone").await;
    let _busy = CpuBurner::start(Duration::from_secs(60));

    // `first` killed three times mid-stream, each time after it made some progress. With a claim
    // idle time of an hour, only `first` itself can settle what it held: by reading its own
    // pending entries when it starts again.
    let an_hour = Duration::from_secs(3600);
    for round in 1..=3 {
        let first = Consumer::spawn(&pool, &key, group, "first", an_hour);
        eventually("the restarted consumer settles the entries it held", || async {
            let pending = pending(&streams, &key, group).await;
            held_by_first.iter().all(|id| !pending.iter().any(|(pending, _)| pending == id))
        })
        .await;
        eventually("the consumer makes progress", || async {
            effects(&pool).await.1 >= 60 * round
        })
        .await;
        first.kill();
        let pending = pending(&streams, &key, group).await;
        assert_eq!(held_by(&pending, "gone"), held_by_gone, "not taken over before the idle time");
        held_by_first = held_by(&pending, "first");
    }
    // Under another name, with a short claim idle time: it takes over what `first` and `gone`
    // left pending.
    let second = Consumer::spawn(&pool, &key, group, "second", Duration::from_secs(1));
    eventually("every event has its effect", || async { effects(&pool).await.1 == 300 }).await;
    eventually("every entry is settled", || settled(&streams, &key, group)).await;
    drop(second);

    let (effects, distinct, repeated) = effects(&pool).await;
    assert_eq!((effects, distinct, repeated), (300, 300, 0), "each effect once");
    let handled: Vec<Uuid> = sqlx::query_scalar(
        "SELECT event_id FROM outbox.inbox WHERE consumer = 'billing' \
         AND handled_at IS NOT NULL ORDER BY event_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut expected = ids;
    expected.sort();
    assert_eq!(handled, expected, "every event recorded handled, and nothing else");
    let mut connection = streams.connection.clone();
    let info: StreamInfoGroupsReply = connection.xinfo_groups(&key).await.unwrap();
    assert_eq!(info.groups[0].entries_read, Some(340), "the broker delivered the 40 copies too");
    assert_eq!(pending(&streams, &key, group).await, [], "nothing left pending, by anyone");
}

#[sqlx::test(migrations = false)]
async fn failures_are_retried_and_poison_is_acknowledged_dead(pool: PgPool) {
    migrated(&pool).await;
    let streams = Streams::create().await;
    let key = format!("{}.jobs", streams.prefix);
    let ids = forwarded(&pool, &streams, &key, 20).await;
    // An entry that is not an outbox message at all.
    let mut connection = streams.connection.clone();
    let stray: String = connection.xadd(&key, "*", &[("note", "not an event")]).await.unwrap();
    // Jobs with an odd number fail once; job 7 fails every time.
    let calls = Calls::default();
    let fails = |job: u64, call: u32| job == 7 || (job % 2 == 1 && call == 1);
    let inbox = counting_inbox(pool.clone(), "flaky", &calls, 3, fails);
    let reader = GroupReader::new(&key, "flaky", "flaky-1");
    let consuming = Consuming::start(&inbox, connect_redis().await, reader);
    eventually("every entry is settled", || settled(&streams, &key, "flaky")).await;
    consuming.stop().await;

    for job in 0..20_u64 {
        let expected = match job {
            7 => 3,
            odd if odd % 2 == 1 => 2,
            _ => 1,
        };
        assert_eq!(calls.of(job), expected, "calls of job {job}");
    }
    let dead: Vec<(Uuid, i32, String)> = sqlx::query_as(
        "SELECT event_id, attempts, last_error FROM outbox.inbox \
         WHERE consumer = 'flaky' AND dead_at IS NOT NULL",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(dead, [(ids[7], 3, "job 7 failed call 3".to_owned())]);
    assert_eq!(inbox_rows(&pool, "flaky").await.0, 19, "the others handled");
    let entries = streams.entries(&key).await;
    assert_eq!(entries.last().map(|(id, _)| id), Some(&stray), "the stray entry kept to inspect");
}

#[sqlx::test(migrations = false)]
async fn a_database_outage_leaves_entries_pending_and_spends_no_attempt(pool: PgPool) {
    migrated(&pool).await;
    let streams = Streams::create().await;
    let key = format!("{}.jobs", streams.prefix);
    forwarded(&pool, &streams, &key, 30).await;
    let proxy = Proxy::to_database(&pool).await;
    proxy.cut();
    // One attempt each: a database failure counted as one would make the entry dead.
    let calls = Calls::default();
    let inbox = counting_inbox(proxy.pool(&pool), "outage", &calls, 1, |_, _| false);
    let reader = GroupReader::new(&key, "outage", "outage-1");
    let consuming = Consuming::start(&inbox, connect_redis().await, reader);
    eventually("entries are read while the database is away", || async {
        !pending(&streams, &key, "outage").await.is_empty()
    })
    .await;
    proxy.restore();
    eventually("every entry is settled", || settled(&streams, &key, "outage")).await;
    consuming.stop().await;

    assert_eq!(inbox_rows(&pool, "outage").await, (30, 0, 0), "all handled, no attempt spent");
    assert!((0..30).all(|job| calls.of(job) == 1), "each handler called once");
}

#[sqlx::test(migrations = false)]
async fn a_redis_connection_cut_mid_stream_loses_and_repeats_nothing(pool: PgPool) {
    migrated(&pool).await;
    let streams = Streams::create().await;
    let key = format!("{}.jobs", streams.prefix);
    forwarded(&pool, &streams, &key, 100).await;
    let proxy = Proxy::start("127.0.0.1:6379").await;
    let client = ::redis::Client::open(format!("redis://{}/", proxy.addr())).unwrap();
    let config = ::redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)));
    let connection = ConnectionManager::new_with_config(client, config).await.unwrap();
    let calls = Calls::default();
    let inbox = counting_inbox(pool.clone(), "cut", &calls, 1, |_, _| false);
    let reader = GroupReader::new(&key, "cut", "cut-1");
    let consuming = Consuming::start(&inbox, connection, reader);
    eventually("some entries are handled", || async { calls.order().len() >= 20 }).await;
    proxy.cut();
    proxy.restore();
    eventually("the consumer connects again", || async { proxy.carried() >= 2 }).await;
    eventually("every entry is settled", || settled(&streams, &key, "cut")).await;
    consuming.stop().await;

    assert_eq!(inbox_rows(&pool, "cut").await, (100, 0, 0), "all handled");
    assert!((0..100).all(|job| calls.of(job) == 1), "each handler called once");
}

#[sqlx::test(migrations = false)]
async fn with_max_retrying_zero_an_entry_waiting_for_its_retry_holds_back_later_ones(pool: PgPool) {
    migrated(&pool).await;
    let streams = Streams::create().await;
    let key = format!("{}.jobs", streams.prefix);
    forwarded(&pool, &streams, &key, 12).await;
    // Job 3 fails its first call, job 8 its first two.
    let calls = Calls::default();
    let fails = |job: u64, call: u32| (job == 3 && call == 1) || (job == 8 && call <= 2);
    let inbox = counting_inbox(pool.clone(), "ordered", &calls, 5, fails);
    let reader = GroupReader::new(&key, "ordered", "ordered-1").max_retrying(0);
    let consuming = Consuming::start(&inbox, connect_redis().await, reader);
    eventually("every entry is settled", || settled(&streams, &key, "ordered")).await;
    consuming.stop().await;

    assert_eq!(calls.order(), (0..12).collect::<Vec<u64>>(), "handled in stream order");
    assert_eq!((calls.of(3), calls.of(8)), (2, 3));
}

/// What the gated handler shares with the test: it says when job 0 started, and finishes job 0
/// only when released.
#[derive(Clone, Default)]
struct Gate {
    started: Arc<Notify>,
    release: Arc<Notify>,
    calls: Calls,
}

async fn gated(ctx: InboxContext<Gate>, job: JobRun) -> Result<(), HandlerError> {
    let gate = ctx.state().clone();
    gate.calls.call(job.job);
    if job.job == 0 {
        gate.started.notify_one();
        gate.release.notified().await;
    }
    gate.calls.succeeded(job.job);
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn a_shutdown_finishes_the_entry_under_way_and_the_same_name_resumes_the_rest(pool: PgPool) {
    migrated(&pool).await;
    let streams = Streams::create().await;
    let key = format!("{}.jobs", streams.prefix);
    forwarded(&pool, &streams, &key, 5).await;
    let gate = Gate::default();
    let inbox =
        Inbox::builder(pool.clone(), "gated").state(gate.clone()).handler(gated).build().unwrap();
    let reader = GroupReader::new(&key, "gated", "gated-1");
    let consuming = Consuming::start(&inbox, connect_redis().await, reader.clone());
    signalled(&gate.started, "job 0 is under way").await;
    // The five entries were read in one batch: job 0 is under way, the others held.
    let _ = consuming.stop.send(());
    gate.release.notify_one();
    within(consuming.task, "consume returns").await.unwrap().expect("consume stops cleanly");

    assert_eq!(gate.calls.order(), [0], "job 0 finished, no other begun");
    let pending = pending(&streams, &key, "gated").await;
    let entries = streams.entries(&key).await;
    let rest: Vec<String> = entries[1..].iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(held_by(&pending, "gated-1"), rest, "job 0 acknowledged, the rest held");
    assert_eq!(inbox_rows(&pool, "gated").await, (1, 0, 0));

    // Started again under the same name, it handles what it held.
    let consuming = Consuming::start(&inbox, connect_redis().await, reader);
    eventually("every entry is settled", || settled(&streams, &key, "gated")).await;
    consuming.stop().await;
    assert_eq!(gate.calls.order(), [0, 1, 2, 3, 4], "each once, in stream order");
    assert!((0..5).all(|job| gate.calls.of(job) == 1), "no call repeated");
}

/// A connection of the consumer's own (its blocking reads hold it).
async fn connect_redis() -> ConnectionManager {
    support::redis::connect().await
}
