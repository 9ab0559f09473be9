//! Benchmarks of the outbox against the local PostgreSQL, each workload in a fresh database,
//! with the baselines measured in the same run.
//!
//! `cargo run --release -p outbox-bench` prints a Markdown table of medians over `--runs`
//! (default 3); `--json` prints the medians as JSON instead; `--quick` shrinks every size for a
//! smoke run; `--skip-heavy` leaves out the 5-million-row history, the 1-million-event memory
//! and scale workloads, the 200,000-event stale-statistics drain and after_drain; `--only
//! emit,drain,...` runs just the named workloads (emit, drain, drain_stale, drain_stale_big,
//! ordering, baselines, steady, history, memory, forward_nats, forward_rabbitmq, forward_redis,
//! forward_kafka, and those of issue #16 "scale": scale, wal_locks, delete, batch, emit_bare,
//! purge; types, a backlog over 50 event types against one; and those of issue #22:
//! insert_floor, wake_ups, after_drain, relays, latency_sql, delete_held; issue #24's inbox and
//! subscribers; issue #25's emit_sqlite, emit_mysql, drain_sqlite and drain_mysql, on SQLite and MariaDB). Ratios are computed within each run, then their
//! median is reported. The forwarding workloads need NATS with JetStream on 127.0.0.1:4222, RabbitMQ on
//! 127.0.0.1:5672 (guest/guest), Redis on 127.0.0.1:6379 and a Kafka-protocol broker on
//! 127.0.0.1:9092 (`scripts/services-up` starts them); they run only when `--only` names them.
//! Memory, scale and after_drain run once, whatever `--runs` says: their million-row tables
//! are expensive to lay down. Scale writes its snapshots (the lease's EXPLAIN ANALYZE, tuple
//! counts and sizes at the start, middle and end of its big drain, and samples over time) to
//! `--report PATH`, by default `target/bench-scale-report.txt`.

mod after_drain;
mod backends;
mod bare;
mod baseline;
mod batch;
mod cpu;
mod db;
mod delete;
mod emit;
mod events;
mod forward;
mod inbox;
mod memory;
mod probe;
mod purge;
mod relay;
mod scale;
mod subscribers;
mod types;
mod wal_locks;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use db::{Database, Stats};
use events::{credited, posted};
use outbox_runtime::LeaseMode;
use relay::Setup;

struct Args {
    url: String,
    runs: usize,
    quick: bool,
    json: bool,
    heavy: bool,
    only: Option<Vec<String>>,
    /// Where the scale workload writes its snapshots.
    report: PathBuf,
}

impl Args {
    /// Whether the workload `name` runs (`--only` names a subset; heavy ones can be skipped).
    fn runs(&self, name: &str) -> bool {
        let heavy =
            matches!(name, "history" | "memory" | "drain_stale_big" | "scale" | "after_drain");
        // The brokers are not part of every machine's setup: those run only when named.
        let brokers = name.starts_with("forward_");
        let default = !brokers && (!heavy || self.heavy);
        self.only.as_ref().map_or(default, |only| only.iter().any(|o| o == name))
    }
}

struct Sizes {
    drain: usize,
    big_drain: usize,
    stale_big_drain: usize,
    /// The ordered backlog of 10 aggregates.
    hot_aggregates: usize,
    history: usize,
    memory: usize,
    /// The scale workload's big backlog.
    scale: usize,
    /// The batch-size sweep's backlog.
    sweep: usize,
    /// The backlog 8 relays drain while lock waits are sampled.
    locks: usize,
    /// The backlog the many-types workload drains, spread over 50 types and in one.
    types: usize,
    /// After a drain: the published history, the burst drained behind it, how long the
    /// caught-up lease is watched.
    after_drain: (usize, usize, Duration),
    seconds: u64,
}

/// Samples per figure, by name.
#[derive(Default)]
struct Samples(BTreeMap<String, Vec<f64>>);

impl Samples {
    fn add(&mut self, name: impl Into<String>, value: f64) {
        let name = name.into();
        eprintln!("  {name}: {value:.2}");
        self.0.entry(name).or_default().push(value);
    }

    fn median(&self, name: &str) -> f64 {
        let mut xs = self.0.get(name).cloned().unwrap_or_default();
        if xs.is_empty() {
            return f64::NAN;
        }
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    }
}

fn args() -> Args {
    let mut args = Args {
        url: std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into()),
        runs: 3,
        quick: false,
        json: false,
        heavy: true,
        only: None,
        report: PathBuf::from("target/bench-scale-report.txt"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--runs" => args.runs = it.next().and_then(|v| v.parse().ok()).expect("--runs N"),
            "--quick" => args.quick = true,
            "--json" => args.json = true,
            "--skip-heavy" => args.heavy = false,
            "--only" => {
                let names = it.next().expect("--only emit,drain,...");
                args.only = Some(names.split(',').map(str::to_owned).collect());
            }
            "--report" => args.report = it.next().expect("--report PATH").into(),
            other => panic!(
                "unknown flag {other}: expected --runs N, --quick, --json, --skip-heavy, --only, \
                 --report PATH"
            ),
        }
    }
    args
}

#[tokio::main]
async fn main() {
    let raw: Vec<String> = std::env::args().collect();
    if raw.get(1).map(String::as_str) == Some("--child-drain") {
        return memory::child(&raw[2], raw[3].parse().unwrap()).await;
    }
    let args = args();
    let sizes = if args.quick {
        Sizes {
            drain: 5_000,
            big_drain: 20_000,
            stale_big_drain: 20_000,
            hot_aggregates: 1_000,
            history: 200_000,
            memory: 50_000,
            scale: 100_000,
            sweep: 50_000,
            locks: 20_000,
            types: 20_000,
            after_drain: (200_000, 20_000, Duration::from_secs(20)),
            seconds: 2,
        }
    } else {
        Sizes {
            drain: 20_000,
            big_drain: 100_000,
            stale_big_drain: 200_000,
            hot_aggregates: 2_000,
            history: 5_000_000,
            memory: 1_000_000,
            scale: 1_000_000,
            sweep: 200_000,
            locks: 100_000,
            types: 100_000,
            after_drain: (2_000_000, 150_000, Duration::from_secs(180)),
            seconds: 5,
        }
    };
    let mut s = Samples::default();
    let secs = Duration::from_secs(sizes.seconds);
    // The relay's defaults (leases sized by the relay) at the given relays and concurrency.
    let c = |relays, concurrency| Setup { batch_size: None, ..Setup::new(relays, concurrency) };

    for run in 1..=args.runs {
        eprintln!("run {run} of {}", args.runs);
        // 1. emit overhead
        if args.runs("emit") {
            let db = Database::fresh(&args.url, "emit").await;
            emit::accounts(&db.pool).await;
            let without = emit::business(&db.pool, 8, secs, emit::Extra::Nothing).await;
            let select = emit::business(&db.pool, 8, secs, emit::Extra::SelectOne).await;
            let with = emit::business(&db.pool, 8, secs, emit::Extra::Emit).await;
            s.add("tx/s without emit", without);
            s.add("tx/s with SELECT 1", select);
            s.add("tx/s with emit", with);
            s.add("emit overhead", without / with);
            s.add("SELECT 1 overhead", without / select);
            s.add("emit_all events/s", emit::batches(&db.pool, 4, secs).await);
            db.drop().await;
        }

        // 2. drain; duplicate handler calls are summed over every drain of the run.
        let duplicates = std::cell::Cell::new(0);
        let drain_with = async |events, setup: Setup, stats| {
            let db = Database::fresh(&args.url, "drain").await;
            if setup.ordered {
                db::backlog_with(&db.pool, events, posted, stats).await;
            } else {
                db::backlog_with(&db.pool, events, credited, stats).await;
            }
            let drained = relay::drain(&db.pool, events, setup).await;
            db.drop().await;
            duplicates.set(duplicates.get() + drained.duplicates);
            drained.events_per_second
        };
        let drain = async |events, setup| drain_with(events, setup, Stats::Vacuumed).await;
        // The reference point of the ratios below.
        let mut c16 = f64::NAN;
        if ["drain", "ordering", "baselines", "history"].iter().any(|w| args.runs(w)) {
            c16 = drain(sizes.drain, c(1, 16)).await;
            s.add("drain c16", c16);
        }
        if args.runs("drain") {
            s.add("drain c1", drain(sizes.drain, c(1, 1)).await);
            s.add("drain c64", drain(sizes.drain, c(1, 64)).await);
            s.add("drain 2 relays c16", drain(sizes.drain, c(2, 16)).await);
            s.add("drain big c16", drain(sizes.big_drain, c(1, 16)).await);
            // A larger batch trades more rows held per relay (and redelivered after a crash)
            // for fewer lease statements: measured apart from the defaults.
            let batch300 = drain(sizes.drain, Setup { batch_size: Some(300), ..c(1, 16) }).await;
            s.add("drain c16 batch 300", batch300);
        }
        // Statistics taken while the outbox was empty (autovacuum off), against the same drain
        // with the table analyzed after filling; one relay with the default settings. The two
        // take turns going first, so neither always follows the previous workload's cleanup.
        let stale = [
            ("drain_stale", sizes.drain, ["drain stale", "drain analyzed", "stale vs analyzed"]),
            (
                "drain_stale_big",
                sizes.stale_big_drain,
                ["drain big stale", "drain big analyzed", "big stale vs analyzed"],
            ),
        ];
        for (workload, events, [empty, analyzed, ratio]) in stale {
            if args.runs(workload) {
                let (with_empty, with_fresh) = if run % 2 == 1 {
                    let with_empty = drain_with(events, c(1, 16), Stats::Empty).await;
                    (with_empty, drain_with(events, c(1, 16), Stats::Analyzed).await)
                } else {
                    let with_fresh = drain_with(events, c(1, 16), Stats::Analyzed).await;
                    (drain_with(events, c(1, 16), Stats::Empty).await, with_fresh)
                };
                s.add(empty, with_empty);
                s.add(analyzed, with_fresh);
                s.add(ratio, with_empty / with_fresh);
            }
        }

        // 4. ordering: 1,000 aggregates, then a backlog held by 10 aggregates (a few hot
        // ones), where most rows wait for a predecessor.
        if args.runs("ordering") {
            let ordered = drain(sizes.drain, Setup { ordered: true, ..c(1, 16) }).await;
            s.add("drain ordered c16", ordered);
            s.add("ordered vs unordered", ordered / c16);
            let db = Database::fresh(&args.url, "drain").await;
            db::backlog(&db.pool, sizes.hot_aggregates, events::posted_to(10)).await;
            let setup = Setup { ordered: true, ..c(1, 16) };
            let hot = relay::drain(&db.pool, sizes.hot_aggregates, setup).await;
            db.drop().await;
            duplicates.set(duplicates.get() + hot.duplicates);
            s.add("drain ordered hot c16", hot.events_per_second);
            s.add("ordered hot vs unordered", hot.events_per_second / c16);
        }

        // 7. baselines
        if args.runs("baselines") {
            let db = Database::fresh(&args.url, "reference").await;
            baseline::reference_schema(&db.pool, sizes.drain).await;
            let (reference, duplicates) = baseline::reference(&db.pool, sizes.drain, 4).await;
            db.drop().await;
            s.add("reference events/s", reference);
            s.add("reference extra deliveries per event", duplicates as f64 / sizes.drain as f64);
            s.add("drain vs reference", c16 / reference);
            let db = Database::fresh(&args.url, "handtuned").await;
            db::backlog(&db.pool, sizes.drain, credited).await;
            let hand_tuned = baseline::hand_tuned(&db.pool, sizes.drain).await;
            db.drop().await;
            s.add("hand-tuned events/s", hand_tuned);
            s.add("drain vs hand-tuned", c16 / hand_tuned);
        }

        // 3. steady state
        if args.runs("steady") {
            let db = Database::fresh(&args.url, "steady").await;
            let (rate, latencies) = relay::paced(&db.pool, 4, secs * 2, None).await;
            db.drop().await;
            s.add("steady events/s", rate);
            s.add("steady p50 ms", percentile_ms(&latencies, 0.50));
            s.add("steady p99 ms", percentile_ms(&latencies, 0.99));
            s.add("steady p99.9 ms", percentile_ms(&latencies, 0.999));
        }

        // 3b. latency under producers: one relay (each lease mode) against plain SQL polling,
        // every millisecond and every 10 ms.
        if args.runs("latency_sql") {
            let mut polled = Vec::new();
            for poll_ms in [1, 10] {
                let db = Database::fresh(&args.url, "latency_polled").await;
                let poll = Duration::from_millis(poll_ms);
                let (rate, sql) = relay::polled(&db.pool, 8, secs * 2, 4, poll).await;
                db.drop().await;
                s.add(format!("latency_sql sql{poll_ms} events/s"), rate);
                s.add(format!("latency_sql sql{poll_ms} p50 ms"), percentile_ms(&sql, 0.50));
                s.add(format!("latency_sql sql{poll_ms} p99 ms"), percentile_ms(&sql, 0.99));
                polled.push((poll_ms, sql));
            }
            let modes = [("written", LeaseMode::Written), ("held", LeaseMode::HeldTransaction)];
            for (name, lease_mode) in modes {
                let db = Database::fresh(&args.url, "latency_relay").await;
                let (rate, latencies) =
                    relay::paced_in(&db.pool, 8, secs * 2, None, lease_mode).await;
                db.drop().await;
                s.add(format!("latency_sql {name} events/s"), rate);
                for (p, q) in [("p50", 0.50), ("p99", 0.99)] {
                    let ms = percentile_ms(&latencies, q);
                    s.add(format!("latency_sql {name} {p} ms"), ms);
                    for (poll_ms, sql) in &polled {
                        let ratio = ms / percentile_ms(sql, q);
                        s.add(format!("latency_sql {name} {p} vs sql{poll_ms}"), ratio);
                    }
                }
            }
        }

        // 8. forwarding to real brokers, each beside the bare client in the same run.
        if args.runs("forward_nats") {
            forwarding::<forward::Nats>(&mut s, "nats", &args.url, sizes.drain, secs).await;
        }
        if args.runs("forward_rabbitmq") {
            forwarding::<forward::Rabbit>(&mut s, "rabbitmq", &args.url, sizes.drain, secs).await;
        }
        if args.runs("forward_redis") {
            forwarding::<forward::Redis>(&mut s, "redis", &args.url, sizes.drain, secs).await;
        }
        if args.runs("forward_kafka") {
            forwarding::<forward::Kafka>(&mut s, "kafka", &args.url, sizes.drain, secs).await;
        }

        // 5. history
        if args.runs("history") {
            let db = Database::fresh(&args.url, "history").await;
            db::history(&db.pool, sizes.history).await;
            db::backlog(&db.pool, sizes.drain, credited).await;
            let drained = relay::drain(&db.pool, sizes.drain, c(1, 16)).await;
            db.drop().await;
            duplicates.set(duplicates.get() + drained.duplicates);
            let rate = drained.events_per_second;
            s.add("drain with history c16", rate);
            s.add("history vs empty", rate / c16);
        }
        // 9. issue #16 "scale": WAL, connections and lock waits.
        if args.runs("wal_locks") {
            let wal = wal_locks::wal(&args.url, 8, secs, sizes.drain).await;
            for (what, per) in
                [("emitted", &wal.emitted), ("bare", &wal.bare), ("delivered", &wal.delivered)]
            {
                s.add(format!("wal {what} bytes"), per.own);
                s.add(format!("wal {what} full-page bytes"), per.full_pages);
                s.add(format!("wal {what} cluster bytes"), per.cluster);
            }
            s.add("wal emit vs bare", wal.emitted.own / wal.bare.own);
            s.add("wal other databases' commits", wal.other_commits as f64);
            let held = wal_locks::connections(&args.url, Duration::from_secs(2), sizes.drain).await;
            eprintln!("  relay connections while draining: {}", held.by_name);
            s.add("relay connections bench", held.bench as f64);
            s.add("relay connections idle", held.idle as f64);
            s.add("relay connections draining", held.draining as f64);
            let waits = wal_locks::lock_waits(&args.url, 8, sizes.locks).await;
            eprintln!("  waits seen (backend-samples): {:?}", waits.by_event);
            s.add("locks 8 relays events/s", waits.events_per_second);
            s.add("lock samples", waits.samples as f64);
            s.add("lock wait samples %", waits.lock_percent());
            s.add("lock waiters max", waits.most_lock as f64);
            s.add("lwlock wait samples %", waits.lwlock_percent());
            s.add("lwlock waiters max", waits.most_lwlock as f64);
            duplicates.set(duplicates.get() + waits.duplicates);
        }

        // 10. deleting on publish against plain SQL deleting in its lease's transaction.
        if args.runs("delete") {
            let (written, held) = (LeaseMode::Written, LeaseMode::HeldTransaction);
            let deleting = delete::relay(&args.url, sizes.drain, true, written).await;
            let marking = delete::relay(&args.url, sizes.drain, false, written).await;
            let held_deleting = delete::relay(&args.url, sizes.drain, true, held).await;
            let held_marking = delete::relay(&args.url, sizes.drain, false, held).await;
            let sql100 = delete::plain_sql(&args.url, sizes.drain, 100).await;
            let sql300 = delete::plain_sql(&args.url, sizes.drain, 300).await;
            let held_from_first = held_deleting.from_first_delivery;
            let sql_from_first = sql100.from_first_delivery.max(sql300.from_first_delivery);
            s.add("delete held from first events/s", held_from_first);
            s.add("delete held vs sql from first", held_from_first / sql_from_first);
            s.add("delete held own us", held_deleting.own_micros);
            s.add("delete held machine us", held_deleting.machine_micros);
            s.add("delete sql b300 own us", sql300.own_micros);
            s.add("delete sql b300 machine us", sql300.machine_micros);
            let [deleting, marking, held_deleting, held_marking, sql100, sql300] =
                [deleting, marking, held_deleting, held_marking, sql100, sql300]
                    .map(|drain| drain.events_per_second);
            s.add("delete relay events/s", deleting);
            s.add("delete mark events/s", marking);
            s.add("delete held events/s", held_deleting);
            s.add("delete held mark events/s", held_marking);
            s.add("delete sql b100 events/s", sql100);
            s.add("delete sql b300 events/s", sql300);
            s.add("delete vs sql", deleting / sql100.max(sql300));
            s.add("delete held vs sql", held_deleting / sql100.max(sql300));
            s.add("delete vs mark", deleting / marking);
            s.add("delete held mark vs mark", held_marking / marking);
            // Five times the drain: plain SQL scans from the head of the pending index, past
            // the entries its deletes left there, so it slows as the drain grows.
            let big = sizes.drain * 5;
            let held_big = delete::relay(&args.url, big, true, held).await.events_per_second;
            let sql_big = delete::plain_sql(&args.url, big, 300).await.events_per_second;
            s.add("delete held x5 events/s", held_big);
            s.add("delete sql b300 x5 events/s", sql_big);
            s.add("delete held x5 vs sql", held_big / sql_big);
        }

        // 10b. the held relay's delete drain alone, ten times the drain, beside plain SQL: the
        // workload to profile the relay's per-event work with (BENCHMARKS.md says how).
        if args.runs("delete_held") {
            let events = sizes.drain * 10;
            let held = delete::relay(&args.url, events, true, LeaseMode::HeldTransaction).await;
            let sql = delete::plain_sql(&args.url, events, 300).await;
            s.add("delete_held x10 events/s", held.events_per_second);
            s.add("delete_held x10 own us", held.own_micros);
            s.add("delete_held x10 machine us", held.machine_micros);
            s.add("delete_held sql b300 x10 events/s", sql.events_per_second);
            s.add("delete_held sql b300 x10 own us", sql.own_micros);
            s.add("delete_held sql b300 x10 machine us", sql.machine_micros);
            s.add("delete_held x10 vs sql", held.events_per_second / sql.events_per_second);
        }

        // 10c. the inbox (issue #24): receiving against the same work in plain SQL.
        if args.runs("inbox") {
            let (count, receivers) = (sizes.drain, 8);
            let inbox = inbox::inbox(&args.url, count, receivers).await;
            let sql = inbox::plain_sql(&args.url, count, receivers).await;
            s.add("inbox new msgs/s", inbox.new);
            s.add("inbox duplicate msgs/s", inbox.duplicates);
            s.add("inbox sql new msgs/s", sql.new);
            s.add("inbox sql duplicate msgs/s", sql.duplicates);
            s.add("inbox new vs sql", inbox.new / sql.new);
            s.add("inbox duplicate vs sql", inbox.duplicates / sql.duplicates);
        }

        // 10d. subscribers (issue #24): three subscribers of one type against one handler.
        if args.runs("subscribers") {
            let d = sizes.drain;
            let one = relay::drain_one(&args.url, d).await;
            let together = subscribers::drain(&args.url, d, 3, subscribers::Relays::One).await;
            let apart = subscribers::drain(&args.url, d, 3, subscribers::Relays::Each).await;
            s.add("subscribers one handler events/s", one);
            s.add("subscribers 3 in 1 relay events/s", together);
            s.add("subscribers 3 in 3 relays events/s", apart);
            // Three relays of one take three drains of the backlog: 3 / one is their time per
            // event, 1 / together the three subscribers'.
            s.add("subscribers 3 in 1 vs 3 of one", 3.0 * together / one);
            s.add("subscribers 3 in 3 vs 3 of one", 3.0 * apart / one);
            let none = subscribers::emit(&args.url, 0, secs).await;
            let three = subscribers::emit(&args.url, 3, secs).await;
            s.add("subscribers emit none tx/s", none);
            s.add("subscribers emit 3 tx/s", three);
            s.add("subscribers emit 3 vs none", none / three);
        }

        // 10e. emit on the other backends (issue #25), against the bare INSERT of the same row.
        for name in ["emit_sqlite", "emit_mysql"] {
            if !args.runs(name) {
                continue;
            }
            let rates = match name {
                "emit_sqlite" => backends::sqlite(secs, 3, run % 2 == 0).await,
                _ => backends::mysql(secs, 3, run % 2 == 0).await,
            };
            s.add(format!("{name} emit tx/s"), rates.emit / 3.0);
            s.add(format!("{name} bare tx/s"), rates.bare / 3.0);
            s.add(format!("{name} bare vs emit"), rates.bare / rates.emit);
            s.add(format!("{name} emit_all events/s"), rates.emit_all);
        }
        for name in ["drain_sqlite", "drain_mysql"] {
            if !args.runs(name) {
                continue;
            }
            let rates = match name {
                "drain_sqlite" => backends::sqlite_drains(sizes.drain, run % 2 == 0).await,
                _ => backends::mysql_drains(sizes.drain, run % 2 == 0).await,
            };
            s.add(format!("{name} relay events/s"), rates.relay);
            s.add(format!("{name} bare events/s"), rates.bare);
            s.add(format!("{name} bare vs relay"), rates.bare / rates.relay);
        }

        // 11. the lease size: default sizing against fixed batch sizes.
        if args.runs("batch") {
            let sweep = batch::sweep(&args.url, sizes.sweep).await;
            s.add("batch default events/s", sweep.default);
            for (size, rate) in batch::SIZES.iter().zip(&sweep.fixed) {
                s.add(format!("batch {size} events/s"), *rate);
            }
            let (best, rate) = sweep.best();
            s.add("batch best size", f64::from(best));
            s.add("batch best events/s", rate);
            s.add("batch default vs best", sweep.default / rate);
            duplicates.set(duplicates.get() + sweep.duplicates);
        }

        // 12. emit against a bare INSERT of the same row, interleaved.
        if args.runs("emit_bare") {
            let db = Database::fresh(&args.url, "emit_bare").await;
            emit::accounts(&db.pool).await;
            bare::schema(&db.pool).await;
            let (with_emit, with_bare) =
                bare::against_emit(&db.pool, 8, secs, 3, run % 2 == 0).await;
            db.drop().await;
            s.add("emit_bare emit tx/s", with_emit);
            s.add("emit_bare bare tx/s", with_bare);
            s.add("bare vs emit", with_bare / with_emit);
        }

        // 14. one event per transaction and nothing else: emit, the same INSERT from SQL, and
        // the bare table's INSERT, rotated.
        if args.runs("insert_floor") {
            let db = Database::fresh(&args.url, "insert_floor").await;
            bare::schema(&db.pool).await;
            let ([emit, sql, floor], [emit_cpu, sql_cpu, floor_cpu]) =
                bare::floor(&db.pool, 8, secs, 3, run).await;
            db.drop().await;
            s.add("insert_floor emit client us", emit_cpu);
            s.add("insert_floor sql client us", sql_cpu);
            s.add("insert_floor bare client us", floor_cpu);
            s.add("insert_floor emit tx/s", emit);
            s.add("insert_floor sql tx/s", sql);
            s.add("insert_floor bare tx/s", floor);
            s.add("bare vs emit alone", floor / emit);
            s.add("bare vs sql insert", floor / sql);
        }

        // 15. an idle relay woken by every event: one producer at 5 events/s.
        if args.runs("wake_ups") {
            let db = Database::fresh(&args.url, "wake_ups").await;
            let (_, latencies) = relay::paced(&db.pool, 1, secs * 4, Some(5.0)).await;
            db.drop().await;
            s.add("wake_ups p50 ms", percentile_ms(&latencies, 0.50));
            s.add("wake_ups p99 ms", percentile_ms(&latencies, 0.99));
        }

        // 17. 8 relays against 4 on the same backlog, with the machine's CPU and the lock
        // waits of each; the sides take turns going first.
        if args.runs("relays") {
            let mut sides = [4, 8];
            if run % 2 == 0 {
                sides.reverse();
            }
            let (mut four, mut eight) = (f64::NAN, f64::NAN);
            for relays in sides {
                let waits = wal_locks::lock_waits(&args.url, relays, sizes.locks).await;
                eprintln!("  {relays} relays, waits seen (backend-samples): {:?}", waits.by_event);
                let rate = waits.events_per_second;
                match relays {
                    4 => four = rate,
                    _ => eight = rate,
                }
                s.add(format!("relays {relays} events/s"), rate);
                s.add(format!("relays {relays} cpu busy %"), 100.0 * waits.cpu_busy);
                s.add(format!("relays {relays} lock wait %"), waits.lock_percent());
                s.add(format!("relays {relays} lwlock wait %"), waits.lwlock_percent());
                duplicates.set(duplicates.get() + waits.duplicates);
            }
            s.add("relays 8 vs 4", eight / four);
        }

        // 13. retention under producers at full speed.
        if args.runs("purge") {
            for (name, producers) in
                [("single", purge::Producers::Single), ("burst", purge::Producers::Batches)]
            {
                let kept = purge::keep_up(&args.url, producers, secs * 2).await;
                s.add(format!("purge {name} produced/s"), kept.produced);
                s.add(format!("purge {name} delivered/s"), kept.delivered);
                s.add(format!("purge {name} deleted/s"), kept.deleted);
                s.add(format!("purge {name} deleted vs produced"), kept.deleted / kept.produced);
                s.add(format!("purge {name} published left"), kept.published as f64);
                s.add(format!("purge {name} pending left"), kept.pending as f64);
            }
        }

        // 15. a backlog over 50 event types against the same backlog in one; the sides take
        // turns going first.
        if args.runs("types") {
            let measured = types::run(&args.url, sizes.types, run % 2 == 1).await;
            for (name, side) in [("spread", measured.spread), ("single", measured.single)] {
                s.add(format!("types {name} 1 relay events/s"), side.one);
                s.add(format!("types {name} 4 relays events/s"), side.four);
                s.add(format!("types {name} wal bytes per event"), side.wal_per_event);
            }
            s.add("types 1 relay spread vs single", measured.spread.one / measured.single.one);
            s.add("types 4 relays spread vs single", measured.spread.four / measured.single.four);
            duplicates.set(duplicates.get() + measured.duplicates);
        }

        let counted = ["drain_stale", "drain_stale_big", "wal_locks", "batch", "types", "relays"];
        if !c16.is_nan() || counted.iter().any(|w| args.runs(w)) {
            s.add("drain duplicates", duplicates.get() as f64);
        }
    }

    // 6. memory, once: a million-event backlog is expensive to lay down.
    if args.runs("memory") {
        let db = Database::fresh(&args.url, "memory").await;
        db::backlog(&db.pool, sizes.memory, credited).await;
        let (peak_mib, rate) = memory::measure(&db.url, sizes.memory);
        db.drop().await;
        s.add("memory peak MiB", peak_mib);
        s.add("memory drain events/s", rate);
    }

    // 16. after a drain, once: millions of history rows to lay down.
    if args.runs("after_drain") {
        let (history, burst, watch) = sizes.after_drain;
        let watched = after_drain::run(&args.url, history, burst, watch).await;
        eprintln!(
            "  after_drain: seconds  lease ms  buffers  n_dead_tup  autovacuums\n{}",
            watched.samples
        );
        s.add("after_drain end lease ms", watched.at_end.0);
        s.add("after_drain end lease buffers", watched.at_end.1 as f64);
        s.add("after_drain last lease ms", watched.last.0);
        s.add("after_drain last lease buffers", watched.last.1 as f64);
        s.add("after_drain cheap after s", watched.cheap_after.unwrap_or(f64::NAN));
        s.add("after_drain autovacuums", watched.autovacuums as f64);
        s.add("after_drain autovacuum on", f64::from(u8::from(watched.autovacuum_on)));
    }

    // 14. scale, once: a million-event backlog, twice.
    let mut report = None;
    if args.runs("scale") {
        let scale = scale::run(&args.url, sizes.scale, sizes.drain).await;
        s.add("scale big 1 relay events/s", scale.one.0);
        s.add("scale small 1 relay events/s", scale.one.1);
        s.add("scale big 4 relays events/s", scale.four.0);
        s.add("scale small 4 relays events/s", scale.four.1);
        s.add("scale 1 relay big vs small", scale.one.0 / scale.one.1);
        s.add("scale 4 relays big vs small", scale.four.0 / scale.four.1);
        s.add("scale duplicates", scale.duplicates as f64);
        for snapshot in &scale.snapshots {
            let at = snapshot.label;
            s.add(format!("scale {at} dead tuples"), snapshot.stats.dead as f64);
            let index = probe::mib(snapshot.size(probe::PENDING_INDEX));
            s.add(format!("scale {at} pending index MiB"), index);
            s.add(format!("scale {at} lease ms"), snapshot.lease.execution_ms);
            s.add(format!("scale {at} lease buffers"), snapshot.lease.buffers as f64);
        }
        if let Some(dir) = args.report.parent().filter(|dir| !dir.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&args.report, &scale.report).unwrap();
        report = Some(&args.report);
    }

    if args.json {
        let medians: BTreeMap<&str, f64> = s.0.keys().map(|k| (k.as_str(), s.median(k))).collect();
        println!("{}", serde_json::to_string_pretty(&medians).unwrap());
    } else {
        print_table(&s, &sizes, args.runs);
    }
    if let Some(path) = report {
        eprintln!("scale snapshots written to {}", path.display());
        if !args.json {
            println!("\nScale snapshots: {}", path.display());
        }
    }
}

/// The forwarding workloads on broker `B`, figures named after `broker`: the drain beside the
/// bare client at the forwarding relay's default concurrency (256) and at 16, then the latency
/// at 2,000 events/s.
async fn forwarding<B: forward::Broker>(
    s: &mut Samples,
    broker: &str,
    url: &str,
    events: usize,
    secs: Duration,
) {
    let mut duplicates = 0;
    for concurrency in [256, 16] {
        let measured = forward::throughput::<B>(url, events, concurrency).await;
        s.add(format!("{broker} relay c{concurrency} events/s"), measured.relay);
        s.add(format!("{broker} bare w{concurrency} events/s"), measured.bare);
        s.add(format!("{broker} relay vs bare c{concurrency}"), measured.relay / measured.bare);
        s.add(format!("{broker} handled events/s c{concurrency}"), measured.handled);
        let vs_handled = measured.relay / measured.handled;
        s.add(format!("{broker} relay vs handled c{concurrency}"), vs_handled);
        let cpu = &measured.cpu;
        for (way, spent) in [("relay", &cpu.relay), ("bare", &cpu.bare), ("handled", &cpu.handled)]
        {
            let per_event = spent.busy_secs * 1e6 / events as f64;
            s.add(format!("{broker} {way} c{concurrency} cpu us/event"), per_event);
            s.add(format!("{broker} {way} c{concurrency} cpu busy"), spent.utilization);
        }
        let profile = &measured.profile;
        s.add(format!("{broker} relay c{concurrency} batch size"), profile.batch_size);
        s.add(format!("{broker} relay c{concurrency} confirm ms"), profile.confirm_ms);
        s.add(format!("{broker} relay c{concurrency} batch interval ms"), profile.interval_ms);
        duplicates += measured.duplicates;
    }
    let latency = forward::latency::<B>(url, 2_000.0, secs).await;
    s.add(format!("{broker} latency events/s"), latency.rate);
    s.add(format!("{broker} latency p50 ms"), percentile_ms(&latency.latencies, 0.50));
    s.add(format!("{broker} latency p99 ms"), percentile_ms(&latency.latencies, 0.99));
    s.add(format!("{broker} latency p99.9 ms"), percentile_ms(&latency.latencies, 0.999));
    s.add(format!("{broker} duplicates"), (duplicates + latency.duplicates) as f64);
}

/// The `q` quantile of sorted `latencies`, in milliseconds.
fn percentile_ms(latencies: &[Duration], q: f64) -> f64 {
    let i = ((latencies.len() as f64 * q) as usize).min(latencies.len() - 1);
    latencies[i].as_secs_f64() * 1e3
}

fn print_table(s: &Samples, sizes: &Sizes, runs: usize) {
    let m = |name| s.median(name);
    let d = sizes.drain;
    println!("Medians of {runs} runs; ratios are computed within each run.\n");
    println!("| workload | result | target |");
    println!("|---|---:|---|");
    let mut rows: Vec<(String, String, String)> = vec![
        (
            "emit overhead: 8 producers, 1 UPDATE per tx, with/without one emit".into(),
            format!(
                "{:.2}x ({:.0} vs {:.0} tx/s)",
                m("emit overhead"),
                m("tx/s without emit"),
                m("tx/s with emit")
            ),
            target(m("emit overhead") <= 1.15, "≤ 1.15x"),
        ),
        (
            "floor: the same with one `SELECT 1` instead of the emit".into(),
            format!("{:.2}x ({:.0} tx/s)", m("SELECT 1 overhead"), m("tx/s with SELECT 1")),
            String::new(),
        ),
        (
            "emit_all, 100 events per tx, 4 producers".into(),
            format!("{:.0} events/s", m("emit_all events/s")),
            target(m("emit_all events/s") >= 50_000.0, "≥ 50k/s"),
        ),
        (
            format!("drain {d}, 1 relay, concurrency 1"),
            format!("{:.0} events/s", m("drain c1")),
            String::new(),
        ),
        (
            format!("drain {d}, 1 relay, concurrency 16"),
            format!("{:.0} events/s", m("drain c16")),
            String::new(),
        ),
        (
            format!("drain {d}, 1 relay, concurrency 64"),
            format!("{:.0} events/s", m("drain c64")),
            String::new(),
        ),
        (
            format!("drain {d}, 2 relays, concurrency 16"),
            format!("{:.0} events/s", m("drain 2 relays c16")),
            String::new(),
        ),
        (
            format!("drain {}, 1 relay, concurrency 16", sizes.big_drain),
            format!("{:.0} events/s", m("drain big c16")),
            String::new(),
        ),
        (
            format!("drain {d}, 1 relay, empty-table statistics vs analyzed after filling"),
            format!(
                "{:.2}x ({:.0} vs {:.0} events/s)",
                m("stale vs analyzed"),
                m("drain stale"),
                m("drain analyzed")
            ),
            target(m("stale vs analyzed") >= 0.9, "≥ 0.9x"),
        ),
        (
            format!(
                "drain {}, 1 relay, empty-table statistics vs analyzed after filling",
                sizes.stale_big_drain
            ),
            format!(
                "{:.2}x ({:.0} vs {:.0} events/s)",
                m("big stale vs analyzed"),
                m("drain big stale"),
                m("drain big analyzed")
            ),
            target(m("big stale vs analyzed") >= 0.9, "≥ 0.9x"),
        ),
        (
            "duplicate handler calls, every drain of a run together".into(),
            format!("{:.0}", m("drain duplicates")),
            target(m("drain duplicates") == 0.0, "0"),
        ),
        (
            format!("option: drain {d}, 1 relay, concurrency 16, batch_size 300"),
            format!("{:.0} events/s", m("drain c16 batch 300")),
            String::new(),
        ),
        (
            format!("hand-tuned plain-SQL relay, drain {d}"),
            format!("{:.0} events/s", m("hand-tuned events/s")),
            String::new(),
        ),
        (
            "drain vs hand-tuned".into(),
            format!("{:.2}x", m("drain vs hand-tuned")),
            target(m("drain vs hand-tuned") >= 1.0, "≥ 1.0x"),
        ),
        (
            format!("reference design SQL, 4 workers, drain {d}"),
            format!(
                "{:.0} events/s, {:.2} extra deliveries per event",
                m("reference events/s"),
                m("reference extra deliveries per event")
            ),
            String::new(),
        ),
        (
            "drain vs reference".into(),
            format!("{:.1}x", m("drain vs reference")),
            target(m("drain vs reference") >= 15.0, "≥ 15x"),
        ),
        (
            "steady state: 4 producers + 1 relay".into(),
            format!(
                "{:.0} events/s; p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms",
                m("steady events/s"),
                m("steady p50 ms"),
                m("steady p99 ms"),
                m("steady p99.9 ms")
            ),
            target(
                m("steady p50 ms") <= 4.0 && m("steady p99 ms") <= 10.0,
                "p50 ≤ 4 ms, p99 ≤ 10 ms",
            ),
        ),
        (
            "latency: 8 producers (1 emit per tx) + 1 relay, written / held lease, vs 4 plain SQL \
             workers polling every 1 / 10 ms"
                .into(),
            format!(
                "p50 {:.2} / {:.2} ms vs {:.2} / {:.2} ms; p99 {:.2} / {:.2} ms vs {:.2} / {:.2} ms; \
                 held vs sql1 p50 {:.2}x, p99 {:.2}x; vs sql10 p50 {:.2}x, p99 {:.2}x",
                m("latency_sql written p50 ms"),
                m("latency_sql held p50 ms"),
                m("latency_sql sql1 p50 ms"),
                m("latency_sql sql10 p50 ms"),
                m("latency_sql written p99 ms"),
                m("latency_sql held p99 ms"),
                m("latency_sql sql1 p99 ms"),
                m("latency_sql sql10 p99 ms"),
                m("latency_sql held p50 vs sql1"),
                m("latency_sql held p99 vs sql1"),
                m("latency_sql held p50 vs sql10"),
                m("latency_sql held p99 vs sql10"),
            ),
            target(
                m("latency_sql written p50 vs sql1") <= 1.1
                    && m("latency_sql written p99 vs sql1") <= 1.1,
                "written ≤ 1.1x sql1, p50 and p99",
            ),
        ),
        (
            format!("ordered drain {d} (1,000 aggregates) vs unordered"),
            format!("{:.2}x ({:.0} events/s)", m("ordered vs unordered"), m("drain ordered c16")),
            target(m("ordered vs unordered") >= 0.5, "≥ 0.5x"),
        ),
        (
            format!(
                "ordered drain {} (10 aggregates, most rows behind a predecessor) vs unordered",
                sizes.hot_aggregates
            ),
            format!(
                "{:.3}x ({:.0} events/s)",
                m("ordered hot vs unordered"),
                m("drain ordered hot c16")
            ),
            target(m("ordered hot vs unordered") >= 0.5, "≥ 0.5x"),
        ),
        (
            format!("drain {d} behind {} published rows vs empty table", sizes.history),
            format!("{:.2}x ({:.0} events/s)", m("history vs empty"), m("drain with history c16")),
            target(m("history vs empty") >= 0.9, "≥ 0.9x"),
        ),
        (
            format!("peak RSS of a relay process draining {}", sizes.memory),
            format!("{:.1} MiB ({:.0} events/s)", m("memory peak MiB"), m("memory drain events/s")),
            target(m("memory peak MiB") <= 64.0, "≤ 64 MiB"),
        ),
    ];
    rows.extend(scale_rows(s, sizes));
    for relays in ["1 relay", "4 relays"] {
        let m = |what: &str| s.median(&format!("types {what}"));
        rows.push((
            format!(
                "drain {} over {} event types vs the same in one type, {relays} (defaults)",
                sizes.types,
                types::TYPES
            ),
            format!(
                "{:.2}x ({:.0} vs {:.0} events/s)",
                m(&format!("{relays} spread vs single")),
                m(&format!("spread {relays} events/s")),
                m(&format!("single {relays} events/s"))
            ),
            target(m(&format!("{relays} spread vs single")) >= 0.9, "≥ 0.9x"),
        ));
    }
    rows.push((
        format!(
            "WAL per event delivered, the 1-relay drains above (whole cluster): {} types / one",
            types::TYPES
        ),
        format!(
            "{:.0} / {:.0} bytes",
            s.median("types spread wal bytes per event"),
            s.median("types single wal bytes per event")
        ),
        String::new(),
    ));
    for (name, producers) in
        [("single", "8 producers, 1 emit per tx"), ("burst", "4 producers, emit_all of 100")]
    {
        let m = |what: &str| s.median(&format!("purge {name} {what}"));
        rows.push((
            format!("retention: {producers}, 1 relay, purge_published(0) in a loop"),
            format!(
                "deleted {:.0}/s vs produced {:.0}/s ({:.2}x; delivered {:.0}/s); at the end \
                 {:.0} published rows unpurged, {:.0} pending",
                m("deleted/s"),
                m("produced/s"),
                m("deleted vs produced"),
                m("delivered/s"),
                m("published left"),
                m("pending left")
            ),
            target(m("deleted/s") >= m("produced/s"), "deleted/s ≥ produced/s"),
        ));
    }
    let brokers = [
        ("nats", "NATS JetStream"),
        ("rabbitmq", "RabbitMQ"),
        ("redis", "Redis Streams"),
        ("kafka", "Kafka (tansu)"),
    ];
    for (broker, name) in brokers {
        let m = |what: &str| s.median(&format!("{broker} {what}"));
        rows.push((
            format!(
                "forward {d} to {name}, 1 relay (defaults: concurrency 256) vs bare client, \
                 window 256"
            ),
            format!(
                "{:.2}x ({:.0} vs {:.0} events/s)",
                m("relay vs bare c256"),
                m("relay c256 events/s"),
                m("bare w256 events/s")
            ),
            target(m("relay vs bare c256") >= 0.8, "≥ 0.8x"),
        ));
        rows.push((
            format!(
                "forward {d} to {name}, 1 relay (defaults) vs the same relay handling the same \
                 backlog with a no-op handler (defaults)"
            ),
            format!(
                "{:.2}x ({:.0} vs {:.0} events/s)",
                m("relay vs handled c256"),
                m("relay c256 events/s"),
                m("handled events/s c256")
            ),
            target(m("relay vs handled c256") >= 0.9, "≥ 0.9x"),
        ));
        let cpu = |way: &str| {
            let m = |what: &str| s.median(&format!("{broker} {way} c256 cpu {what}"));
            format!("{:.1} µs ({:.0}% busy)", m("us/event"), m("busy") * 100.0)
        };
        rows.push((
            format!(
                "profile: the machine's CPU per event to {name} (every process), forwarding vs \
                 no-op handler vs bare client"
            ),
            format!("{} vs {} vs {}", cpu("relay"), cpu("handled"), cpu("bare")),
            String::new(),
        ));
        rows.push((
            format!("option: forward {d} to {name}, concurrency 16 vs bare client, window 16"),
            format!(
                "{:.2}x ({:.0} vs {:.0} events/s)",
                m("relay vs bare c16"),
                m("relay c16 events/s"),
                m("bare w16 events/s")
            ),
            String::new(),
        ));
        for c in [256, 16] {
            let m = |what: &str| s.median(&format!("{broker} relay c{c} {what}"));
            rows.push((
                format!("profile: the relay's batches to {name}, concurrency {c}"),
                format!(
                    "{:.1} messages every {:.2} ms, {:.2} ms of it publish to last confirmation",
                    m("batch size"),
                    m("batch interval ms"),
                    m("confirm ms")
                ),
                String::new(),
            ));
        }
        rows.push((
            format!(
                "commit-to-consumer latency via {name}, 1 relay (defaults), 4 producers at \
                 2,000 events/s"
            ),
            format!(
                "{:.0} events/s; p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms",
                m("latency events/s"),
                m("latency p50 ms"),
                m("latency p99 ms"),
                m("latency p99.9 ms")
            ),
            target(m("latency p99 ms") <= 20.0, "p99 ≤ 20 ms"),
        ));
        rows.push((
            format!("messages beyond one per event at {name}, every forwarding workload of a run"),
            format!("{:.0}", m("duplicates")),
            target(m("duplicates") == 0.0, "0"),
        ));
    }
    // Rows of workloads that did not run (`--only`) have no figures.
    for (workload, result, target) in rows.into_iter().filter(|(_, r, _)| !r.contains("NaN")) {
        println!("| {workload} | {result} | {target} |");
    }
}

/// The rows of the issue #16 "scale" workloads but retention's.
fn scale_rows(s: &Samples, sizes: &Sizes) -> Vec<(String, String, String)> {
    let m = |name: &str| s.median(name);
    let d = sizes.drain;
    let at = |what: &str| ["start", "middle", "end"].map(|p| m(&format!("scale {p} {what}")));
    let (dead, index) = (at("dead tuples"), at("pending index MiB"));
    let (lease, buffers) = (at("lease ms"), at("lease buffers"));
    let fixed: Vec<String> =
        batch::SIZES.iter().map(|n| format!("{:.0}", m(&format!("batch {n} events/s")))).collect();
    vec![
        (
            format!("scale: drain {} vs {d}, 1 relay (defaults)", sizes.scale),
            format!(
                "{:.2}x ({:.0} vs {:.0} events/s)",
                m("scale 1 relay big vs small"),
                m("scale big 1 relay events/s"),
                m("scale small 1 relay events/s")
            ),
            target(m("scale 1 relay big vs small") >= 0.7, "≥ 0.7x"),
        ),
        (
            format!("scale: drain {} vs {d}, 4 relays (defaults)", sizes.scale),
            format!(
                "{:.2}x ({:.0} vs {:.0} events/s)",
                m("scale 4 relays big vs small"),
                m("scale big 4 relays events/s"),
                m("scale small 4 relays events/s")
            ),
            target(m("scale 4 relays big vs small") >= 0.7, "≥ 0.7x"),
        ),
        (
            format!(
                "scale: drain {} by 1 relay, start / middle / end: dead tuples; pending index",
                sizes.scale
            ),
            format!(
                "{:.0} / {:.0} / {:.0}; {:.1} / {:.1} / {:.1} MiB",
                dead[0], dead[1], dead[2], index[0], index[1], index[2]
            ),
            String::new(),
        ),
        (
            "scale: the relay's lease there (EXPLAIN ANALYZE, rolled back)".into(),
            format!(
                "{:.2} / {:.2} / {:.2} ms; {:.0} / {:.0} / {:.0} shared buffers hit+read",
                lease[0], lease[1], lease[2], buffers[0], buffers[1], buffers[2]
            ),
            String::new(),
        ),
        (
            "scale: duplicate handler calls, every scale drain together".into(),
            format!("{:.0}", m("scale duplicates")),
            target(m("scale duplicates") == 0.0, "0"),
        ),
        (
            format!(
                "WAL per event, this database's records (of which full-page images): emitted (8 \
                 producers, 1 emit per tx) / bare INSERT (the same) / delivered (drain {d}, 1 relay)"
            ),
            format!(
                "{:.0} ({:.0}) / {:.0} ({:.0}) / {:.0} ({:.0}) bytes; emit {:.2}x bare",
                m("wal emitted bytes"),
                m("wal emitted full-page bytes"),
                m("wal bare bytes"),
                m("wal bare full-page bytes"),
                m("wal delivered bytes"),
                m("wal delivered full-page bytes"),
                m("wal emit vs bare"),
            ),
            String::new(),
        ),
        (
            "the same by pg_wal_lsn_diff, the whole cluster (other databases' commits meanwhile)"
                .into(),
            format!(
                "{:.0} / {:.0} / {:.0} bytes ({:.0} commits elsewhere)",
                m("wal emitted cluster bytes"),
                m("wal bare cluster bytes"),
                m("wal delivered cluster bytes"),
                m("wal other databases' commits")
            ),
            String::new(),
        ),
        (
            "connections of one relay (defaults), idle / draining".into(),
            format!(
                "{:.0} / {:.0} (beside the bench's own {:.0})",
                m("relay connections idle"),
                m("relay connections draining"),
                m("relay connections bench")
            ),
            String::new(),
        ),
        (
            format!("lock waits, 8 relays (defaults) draining {} together, sampled every 5 ms", sizes.locks),
            format!(
                "Lock: {:.1}% of {:.0} samples, at most {:.0} waiting; LWLock: {:.1}%, at most \
                 {:.0}; {:.0} events/s",
                m("lock wait samples %"),
                m("lock samples"),
                m("lock waiters max"),
                m("lwlock wait samples %"),
                m("lwlock waiters max"),
                m("locks 8 relays events/s")
            ),
            String::new(),
        ),
        (
            format!(
                "drain {d}, 1 relay (defaults), delete_on_publish vs plain SQL deleting in its lease's \
                 transaction (better of batch 100 and 300)"
            ),
            format!(
                "{:.2}x ({:.0} vs {:.0} / {:.0} events/s)",
                m("delete vs sql"),
                m("delete relay events/s"),
                m("delete sql b100 events/s"),
                m("delete sql b300 events/s")
            ),
            String::new(),
        ),
        (
            format!(
                "drain {d}, 1 relay (defaults, `LeaseMode::HeldTransaction`), delete_on_publish vs \
                 the same plain SQL"
            ),
            format!(
                "{:.2}x ({:.0} events/s)",
                m("delete held vs sql"),
                m("delete held events/s")
            ),
            target(m("delete held vs sql") >= 0.9, "≥ 0.9x"),
        ),
        (
            "the same, timed from the first handler call on (the relay's start-up and first lease \
             left out, and plain SQL's first batch)"
                .into(),
            format!(
                "{:.2}x ({:.0} events/s)",
                m("delete held vs sql from first"),
                m("delete held from first events/s")
            ),
            String::new(),
        ),
        (
            "CPU per event there, the bench's process (relay or SQL worker) / the whole machine: \
             held relay deleting vs plain SQL (batch 300)"
                .into(),
            format!(
                "{:.1} / {:.1} µs vs {:.1} / {:.1} µs",
                m("delete held own us"),
                m("delete held machine us"),
                m("delete sql b300 own us"),
                m("delete sql b300 machine us")
            ),
            String::new(),
        ),
        (
            format!(
                "drain {}, the same: `LeaseMode::HeldTransaction` with delete_on_publish vs plain \
                 SQL (batch 300)",
                sizes.drain * 5
            ),
            format!(
                "{:.2}x ({:.0} vs {:.0} events/s)",
                m("delete held x5 vs sql"),
                m("delete held x5 events/s"),
                m("delete sql b300 x5 events/s")
            ),
            target(m("delete held x5 vs sql") >= 0.9, "≥ 0.9x"),
        ),
        (
            format!(
                "drain {} (`--only delete_held`, the workload to profile): held relay deleting vs \
                 plain SQL (batch 300); CPU per event, process / machine",
                sizes.drain * 10
            ),
            format!(
                "{:.2}x ({:.0} vs {:.0} events/s; {:.1} / {:.1} µs vs {:.1} / {:.1} µs)",
                m("delete_held x10 vs sql"),
                m("delete_held x10 events/s"),
                m("delete_held sql b300 x10 events/s"),
                m("delete_held x10 own us"),
                m("delete_held x10 machine us"),
                m("delete_held sql b300 x10 own us"),
                m("delete_held sql b300 x10 machine us")
            ),
            String::new(),
        ),
        (
            format!(
                "drain {d}, 1 relay (defaults, `LeaseMode::HeldTransaction`), marking published vs \
                 the written lease marking published"
            ),
            format!(
                "{:.2}x ({:.0} events/s)",
                m("delete held mark vs mark"),
                m("delete held mark events/s")
            ),
            String::new(),
        ),
        (
            format!("drain {d}, 1 relay (defaults), delete_on_publish vs marking published"),
            format!("{:.2}x ({:.0} events/s marking)", m("delete vs mark"), m("delete mark events/s")),
            String::new(),
        ),
        (
            format!(
                "inbox: {d} messages, 8 receivers, `Inbox::receive` vs plain SQL recording the id \
                 and writing the effect in one transaction; new, then all again as duplicates"
            ),
            format!(
                "{:.2}x / {:.2}x ({:.0} / {:.0} vs {:.0} / {:.0} messages/s)",
                m("inbox new vs sql"),
                m("inbox duplicate vs sql"),
                m("inbox new msgs/s"),
                m("inbox duplicate msgs/s"),
                m("inbox sql new msgs/s"),
                m("inbox sql duplicate msgs/s")
            ),
            String::new(),
        ),
        (
            format!(
                "subscribers: drain {d} to 3 subscribers, in 1 relay / in 3 relays of 1 each, vs \
                 3 drains of one handler (defaults)"
            ),
            format!(
                "{:.2}x / {:.2}x ({:.0} / {:.0} vs {:.0} events/s)",
                m("subscribers 3 in 1 vs 3 of one"),
                m("subscribers 3 in 3 vs 3 of one"),
                m("subscribers 3 in 1 relay events/s"),
                m("subscribers 3 in 3 relays events/s"),
                m("subscribers one handler events/s")
            ),
            target(m("subscribers 3 in 1 vs 3 of one") >= 1.0, "≥ 1x"),
        ),
        (
            "SQLite: bare INSERT of the same row vs emit, 1 producer, 1 UPDATE per tx, 3 \
             rounds each, alternating; emit_all of 100"
                .into(),
            format!(
                "{:.2}x ({:.0} vs {:.0} tx/s); {:.0} events/s",
                m("emit_sqlite bare vs emit"),
                m("emit_sqlite bare tx/s"),
                m("emit_sqlite emit tx/s"),
                m("emit_sqlite emit_all events/s")
            ),
            target(m("emit_sqlite bare vs emit") <= 1.1, "≤ 1.1x"),
        ),
        (
            "MariaDB: bare INSERT of the same row vs emit, 8 producers, 1 UPDATE per tx, 3 \
             rounds each, alternating; emit_all of 100"
                .into(),
            format!(
                "{:.2}x ({:.0} vs {:.0} tx/s); {:.0} events/s",
                m("emit_mysql bare vs emit"),
                m("emit_mysql bare tx/s"),
                m("emit_mysql emit tx/s"),
                m("emit_mysql emit_all events/s")
            ),
            target(m("emit_mysql bare vs emit") <= 1.1, "≤ 1.1x"),
        ),
        (
            "SQLite: a backlog drained by one relay (defaults) vs a hand-written loop (100 rows \
             read, decoded and published per transaction)"
                .into(),
            format!(
                "{:.2}x ({:.0} vs {:.0} events/s)",
                m("drain_sqlite bare vs relay"),
                m("drain_sqlite bare events/s"),
                m("drain_sqlite relay events/s")
            ),
            target(m("drain_sqlite bare vs relay") <= 1.5, "≤ 1.5x"),
        ),
        (
            "MariaDB: a backlog drained by one relay (defaults) vs a hand-written loop (100 rows \
             locked SKIP LOCKED, decoded and published per transaction)"
                .into(),
            format!(
                "{:.2}x ({:.0} vs {:.0} events/s)",
                m("drain_mysql bare vs relay"),
                m("drain_mysql bare events/s"),
                m("drain_mysql relay events/s")
            ),
            target(m("drain_mysql bare vs relay") <= 1.5, "≤ 1.5x"),
        ),
        (
            "subscribers: emit overhead with 3 subscribers registered vs none (8 producers)".into(),
            format!(
                "{:.2}x ({:.0} vs {:.0} tx/s)",
                m("subscribers emit 3 vs none"),
                m("subscribers emit 3 tx/s"),
                m("subscribers emit none tx/s")
            ),
            target(m("subscribers emit 3 vs none") <= 1.05, "≤ 1.05x"),
        ),
        (
            format!(
                "drain {}, 1 relay, concurrency 16: default lease sizing vs the best fixed \
                 batch_size",
                sizes.sweep
            ),
            format!(
                "{:.2}x ({:.0} vs {:.0} events/s at {:.0})",
                m("batch default vs best"),
                m("batch default events/s"),
                m("batch best events/s"),
                m("batch best size")
            ),
            target(m("batch default vs best") >= 0.95, "≥ 0.95x"),
        ),
        (
            format!(
                "the same with batch_size {}",
                batch::SIZES.map(|n| n.to_string()).join(" / ")
            ),
            format!("{} events/s", fixed.join(" / ")),
            String::new(),
        ),
        (
            "bare INSERT of the same row vs emit: 8 producers, 1 UPDATE per tx, 3 rounds each, \
             interleaved"
                .into(),
            format!(
                "{:.2}x ({:.0} vs {:.0} tx/s)",
                m("bare vs emit"),
                m("emit_bare bare tx/s"),
                m("emit_bare emit tx/s")
            ),
            target(m("bare vs emit") <= 1.1, "≤ 1.1x"),
        ),
        (
            "bare INSERT vs emit alone, and vs the same INSERT into outbox.events from SQL: 8 \
             producers, 1 event per tx, nothing else, 3 rounds each, rotated"
                .into(),
            format!(
                "{:.2}x and {:.2}x ({:.0} bare, {:.0} emit, {:.0} SQL tx/s)",
                m("bare vs emit alone"),
                m("bare vs sql insert"),
                m("insert_floor bare tx/s"),
                m("insert_floor emit tx/s"),
                m("insert_floor sql tx/s")
            ),
            target(m("bare vs emit alone") <= 1.1 && m("bare vs sql insert") <= 1.1, "≤ 1.1x"),
        ),
        (
            "the bench process's own CPU per transaction there (the client side): emit / the \
             same INSERT from SQL / bare INSERT"
                .into(),
            format!(
                "{:.1} / {:.1} / {:.1} µs",
                m("insert_floor emit client us"),
                m("insert_floor sql client us"),
                m("insert_floor bare client us")
            ),
            String::new(),
        ),
        (
            "wake-ups: 1 producer at 5 events/s, 1 idle relay (defaults)".into(),
            format!("p50 {:.2} ms, p99 {:.2} ms", m("wake_ups p50 ms"), m("wake_ups p99 ms")),
            target(m("wake_ups p50 ms") <= 5.0, "p50 ≤ 5 ms"),
        ),
        (
            format!(
                "8 relays vs 4 draining {} events (defaults); both cores busy, heavyweight / \
                 lightweight lock waits in the 5 ms samples",
                sizes.locks
            ),
            format!(
                "{:.2}x ({:.0} vs {:.0} events/s; busy {:.0}% vs {:.0}%; lock waits {:.0}% / \
                 {:.0}% vs {:.0}% / {:.0}%)",
                m("relays 8 vs 4"),
                m("relays 8 events/s"),
                m("relays 4 events/s"),
                m("relays 8 cpu busy %"),
                m("relays 4 cpu busy %"),
                m("relays 8 lock wait %"),
                m("relays 8 lwlock wait %"),
                m("relays 4 lock wait %"),
                m("relays 4 lwlock wait %")
            ),
            target(m("relays 8 vs 4") >= 1.2, "≥ 1.2x"),
        ),
        (
            {
                let (history, burst, watch) = sizes.after_drain;
                format!(
                    "after draining {burst} events behind {history} published, 1 relay: the \
                     caught-up lease at the end and {} s later, and when it first read a tenth \
                     of the buffers",
                    watch.as_secs()
                )
            },
            {
                let cheap = m("after_drain cheap after s");
                let cheap = if cheap.is_nan() { "never".into() } else { format!("after {cheap:.0} s") };
                let autovacuum =
                    if m("after_drain autovacuum on") > 0.0 { "on" } else { "off on this server" };
                format!(
                    "{:.1} ms ({:.0} buffers), then {:.1} ms ({:.0}); cheap {cheap}; {:.0} \
                     autovacuums (autovacuum {autovacuum})",
                    m("after_drain end lease ms"),
                    m("after_drain end lease buffers"),
                    m("after_drain last lease ms"),
                    m("after_drain last lease buffers"),
                    m("after_drain autovacuums"),
                )
            },
            target(!m("after_drain cheap after s").is_nan(), "cheap within the watch"),
        ),
    ]
}

fn target(met: bool, goal: &str) -> String {
    format!("{goal}: {}", if met { "met" } else { "missed" })
}
